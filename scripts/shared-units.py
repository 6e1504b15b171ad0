#!/usr/bin/env python3
"""Check that `cargo test --workspace` and the wgpu tests (scripts/test-wgpu.sh) share their
compiled dependencies: list each crate the two builds resolve with other features, outside the
ones the `wgpu` feature itself changes (Burn's and CubeCL's crates, the workspace's own). Such a
crate is another unit to cargo, and so is every crate above it: before hack/ the wgpu build
compiled most of the tree a second time. Exits 1 with what hack/Cargo.toml should add.

Reads cargo's unit graphs (`--unit-graph`, an unstable flag: RUSTC_BOOTSTRAP=1 lets the stable
toolchain print them; nothing is built).

  python3 scripts/shared-units.py
"""
import json
import os
import subprocess
import sys

WGPU = ["-p", "llaisys-model", "-p", "llaisys-server", "--features", "llaisys-model/wgpu,llaisys-server/wgpu"]
# The crates whose features the `wgpu` feature changes on purpose.
CHANGED_BY_WGPU = ("llaisys-", "burn", "cubecl")


def unit_graph(args):
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    out = subprocess.run(
        ["cargo", "test", "--no-run", "-Z", "unstable-options", "--unit-graph", *args],
        env=env, check=True, stdout=subprocess.PIPE, text=True,
    ).stdout
    return json.loads(out)["units"]


def features_by_crate(units):
    """(package, target, mode) -> the feature sets its units are built with."""
    crates = {}
    for u in units:
        package = u["pkg_id"].split("#")[-1]
        crates.setdefault((package, u["target"]["name"], u["mode"]), set()).add(tuple(sorted(u["features"])))
    return crates


def main():
    default = features_by_crate(unit_graph(["--workspace"]))
    wgpu = features_by_crate(unit_graph(WGPU))
    apart = []
    for key, sets in sorted(wgpu.items()):
        package = key[0]
        if key not in default or package.startswith(CHANGED_BY_WGPU) or sets == default[key]:
            continue
        apart.append((key, sorted(sets), sorted(default[key])))
    if not apart:
        print("the default and the wgpu builds share every dependency they both build")
        return 0
    print("crates the default and the wgpu builds compile with other features (each a second build")
    print("of it and of everything above it): give hack/Cargo.toml the union, under [dependencies]")
    print("and, for build scripts and proc macros, [build-dependencies]")
    for (package, target, mode), ours, theirs in apart:
        print(f"  {package} ({target}, {mode}): wgpu build {ours}, default build {theirs}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
