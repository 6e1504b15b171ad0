//! Every committed input of every target's corpus (`corpus/TARGET/`): the seeds the drivers
//! start from, and each input a fuzzer ever found a crash with (named `crash-*`, kept after the
//! fix as a regression case). None may panic.

use llaisys_fuzz::TARGETS;

#[test]
fn every_corpus_input_runs_without_a_panic() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for target in TARGETS {
        let dir = root.join(target.name);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        inputs.sort();
        assert!(!inputs.is_empty(), "{}: no seeds", dir.display());
        for path in inputs {
            let data = std::fs::read(&path).unwrap();
            let ran = std::panic::catch_unwind(|| (target.run)(&data));
            assert!(ran.is_ok(), "{} panics on {}", target.name, path.display());
        }
    }
}
