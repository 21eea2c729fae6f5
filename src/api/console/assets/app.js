// Placeholder: the console's script is written apart and replaces this file.
"use strict";
