//! `karpenter-hub-webhook`: the admission webhook of Clever Karpenter Hub (being built).

fn main() -> anyhow::Result<()> {
    anyhow::bail!("the admission webhook is not built yet")
}
