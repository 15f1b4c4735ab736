//! `karpenter-hub`: the Clever Karpenter Hub command line.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Clever Karpenter Hub: one Karpenter for a fleet of Clever Kubernetes Engine clusters.
#[derive(Debug, Parser)]
#[command(name = "karpenter-hub", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the hub's CustomResourceDefinitions as YAML (what `kubectl apply --server-side -f` takes).
    Crds {
        /// Write one file per CRD into this directory (as committed under `crds/`) instead of printing
        /// them; the stand-in NodeGroup CRD for tests goes to `<DIR>/testing/`.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Offline dry run: read manifests (NodePools, node classes, catalogues, NodeClaims, Nodes, Pods,
    /// DaemonSets, PDBs) and print the NodeClaims the hub would create for the pending pods.
    Plan(operator::plan::PlanArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds { out_dir: None } => {
            let yaml = crds::crd::render_all()?;
            std::io::stdout().lock().write_all(yaml.as_bytes()).context("writing to stdout")?;
        }
        Command::Crds { out_dir: Some(dir) } => write_crds(&dir)?,
        Command::Plan(args) => {
            let out = operator::plan::run(&args)?;
            std::io::stdout().lock().write_all(out.as_bytes()).context("writing to stdout")?;
        }
    }
    Ok(())
}

fn write_crds(dir: &Path) -> anyhow::Result<()> {
    let testing = dir.join("testing");
    fs::create_dir_all(&testing).with_context(|| format!("creating {}", testing.display()))?;
    let files = crds::crd::hub_crds()
        .into_iter()
        .map(|f| (dir.to_path_buf(), f))
        .chain(crds::crd::testing_crds().into_iter().map(|f| (testing.clone(), f)));
    for (parent, file) in files {
        let path = parent.join(&file.file_name);
        // Write to a temporary file and rename, so an interrupted run never leaves a half-written CRD.
        let tmp = parent.join(format!(".{}.tmp", file.file_name));
        fs::write(&tmp, crds::crd::render(&file.crd)?).with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
