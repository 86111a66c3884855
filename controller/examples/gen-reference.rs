//! Writes the reference pages generated from the code (`docs/src/reference/*.md` and
//! `charts/duet/README.md`) into the repository given as the only argument (default: the
//! workspace this example was built from). Run through `docs/generate-reference.sh`.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let root = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."));
    let pages = controller::reference::pages(&root).map_err(anyhow::Error::msg)?;
    for page in pages {
        let path = root.join(page.path);
        let unchanged = std::fs::read_to_string(&path).is_ok_and(|old| old == page.text);
        if !unchanged {
            std::fs::write(&path, &page.text)?;
            println!("wrote {}", page.path);
        }
    }
    Ok(())
}
