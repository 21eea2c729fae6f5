//! `gaffer tasks chain CHAIN [--json]`: a chain as a tree, every task with its state.

use std::collections::BTreeMap;

use clap::Args;

use crate::chain::{self, ChainTargets, ChainTask, ChainView, Member};
use crate::cli::{CliError, Global};
use crate::printable::{one_line, printable};

/// Arguments of `gaffer tasks chain`.
#[derive(Args)]
pub struct ChainArgs {
    /// The chain's id (`~cQUEUE.N`), as a submit, `push --chain` or a task's record
    /// says it
    pub id: String,
    /// Print the API's chain document
    #[arg(long)]
    pub json: bool,
}

/// `gaffer tasks chain`: exit 1 when no such chain is known.
pub async fn run(global: &Global, args: ChainArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    let targets = ChainTargets::from_config(&cfg);
    let Some(view) = chain::read(&client, &targets, &args.id).await? else {
        return Err(CliError::runtime(format!("no chain {:?}", args.id)));
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view.to_json())?);
    } else {
        print!("{}", tree(&view));
    }
    Ok(())
}

/// The chain as text: a head line with its state, then each task under its parent.
pub fn tree(view: &ChainView) -> String {
    let mut out = format!("chain {}: {}", printable(&view.id), view.state.as_str());
    if let Some(m) = &view.failed {
        out.push_str(&format!(
            " (task {} of queue {} failed)",
            printable(&m.id),
            printable(&m.queue)
        ));
    }
    out.push('\n');
    let mut children: BTreeMap<&Member, Vec<&ChainTask>> = BTreeMap::new();
    for t in &view.tasks {
        if let Some(p) = &t.parent {
            children.entry(p).or_default().push(t);
        }
    }
    if let Some(root) = view.tasks.first() {
        branch(&mut out, root, &children, "", "");
    }
    out
}

fn branch(
    out: &mut String,
    t: &ChainTask,
    children: &BTreeMap<&Member, Vec<&ChainTask>>,
    lead: &str,
    rest: &str,
) {
    let state = t
        .record
        .as_ref()
        .map_or("(record expired)".to_string(), |r| r.state.to_string());
    let error = t
        .record
        .as_ref()
        .and_then(|r| r.error.as_deref())
        .filter(|_| t.record.as_ref().is_some_and(|r| r.state.is_end()))
        .map(|e| format!("  {}", one_line(e)))
        .unwrap_or_default();
    out.push_str(&format!(
        "{lead}{} {}  {state}{error}\n",
        printable(&t.member.queue),
        printable(&t.member.id)
    ));
    let kids = children.get(&t.member).map(Vec::as_slice).unwrap_or(&[]);
    for (i, k) in kids.iter().enumerate() {
        let last = i + 1 == kids.len();
        let (l, r) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        branch(
            out,
            k,
            children,
            &format!("{rest}{l}"),
            &format!("{rest}{r}"),
        );
    }
}
