//! Keys to actions. The mappings know nothing of the state: `update` decides what a key
//! means in a dialog, in help or in a view. There are two: [`action_for`] for commands,
//! and [`typing_action_for`] while the task lookup line is open, where letters are text.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::state::Action;

/// The action for a key press; None for keys the dashboard does not use (and for
/// releases and repeats, which some terminals report as well).
pub fn action_for(key: KeyEvent) -> Option<Action> {
    if key.kind != KeyEventKind::Press {
        return None;
    }
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        // Raw mode turns Ctrl-C into a key instead of SIGINT.
        return matches!(key.code, KeyCode::Char('c')).then_some(Action::Quit);
    }
    Some(match key.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Tab | KeyCode::BackTab => Action::NextView,
        KeyCode::Char('1') => Action::ShowQueues,
        KeyCode::Char('2') => Action::ShowSlotMap,
        KeyCode::Char('3') => Action::ShowSystems,
        KeyCode::Char('k') | KeyCode::Up => Action::Up,
        KeyCode::Char('j') | KeyCode::Down => Action::Down,
        KeyCode::Char('h') | KeyCode::Left => Action::Left,
        KeyCode::Char('l') | KeyCode::Right => Action::Right,
        KeyCode::Enter => Action::Open,
        KeyCode::Esc => Action::Back,
        KeyCode::Char('s') => Action::Sort,
        KeyCode::Char('S') => Action::ReverseSort,
        KeyCode::Char('p') => Action::Pause,
        KeyCode::Char('d') => Action::Drain,
        KeyCode::Char('r') => Action::Requeue,
        KeyCode::Char('i') => Action::Intake,
        KeyCode::Char('y') | KeyCode::Char('Y') => Action::Confirm,
        KeyCode::Char('n') | KeyCode::Char('N') => Action::Cancel,
        KeyCode::Char('?') => Action::Help,
        KeyCode::Char('/') => Action::Find,
        _ => return None,
    })
}

/// The action for a key press while the lookup line is open: characters are typed,
/// Backspace erases, ↑ ↓ Tab choose the queue, Enter looks up, Esc closes, Ctrl-C quits.
pub fn typing_action_for(key: KeyEvent) -> Option<Action> {
    if key.kind != KeyEventKind::Press {
        return None;
    }
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return matches!(key.code, KeyCode::Char('c')).then_some(Action::Quit);
    }
    Some(match key.code {
        KeyCode::Char(c) => Action::Type(c),
        KeyCode::Backspace => Action::Erase,
        KeyCode::Tab | KeyCode::Down => Action::Down,
        KeyCode::BackTab | KeyCode::Up => Action::Up,
        KeyCode::Enter => Action::Open,
        KeyCode::Esc => Action::Back,
        _ => return None,
    })
}

/// The keys, as the help overlay lists them.
pub const KEYS: &[(&str, &str)] = &[
    ("Tab  1  2", "switch view: queues, slot map"),
    ("3", "external systems: state, queues, caps, use"),
    ("Enter", "detail of the selected queue or host"),
    ("Esc", "back, close a dialog"),
    ("j k  ↓ ↑", "move the selection; scroll a task's history"),
    ("h l  ← →", "scroll the slot map's queue columns"),
    ("s  S", "next sort column, reverse the sort (queues)"),
    ("p", "pause / resume the selected queue"),
    ("r", "requeue the selected queue's dead letters"),
    ("i", "switch the queue's intake: open, closed, cancel"),
    ("d", "drain / undrain the selected host (slot map)"),
    ("/", "look up a task by id (Tab ↑ ↓ choose the queue)"),
    ("y  n", "confirm / cancel"),
    ("?", "this help"),
    ("q  Ctrl-C", "quit"),
];
