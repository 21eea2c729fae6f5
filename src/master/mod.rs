//! The host daemon: starts the zygote, reconciles running slots to this host's part of the
//! slot map, sizes the host from measured memory, supervises and reports.
