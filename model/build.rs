//! Tells the tests which instruction sets the building machine has, so that a kernel's test is
//! `#[ignore]`d with the reason on a CPU that cannot run it (instead of passing without checking
//! anything). The kernels themselves choose at run time; nothing but test attributes reads these.
//!
//! - `cpu_avx2`: AVX2, FMA and F16C (the quantized AVX2 kernel);
//! - `cpu_avx512`: pulp's `V4` set (AVX-512 F, BW, CD, DQ, VL over AVX2, FMA, BMI, LZCNT);
//! - `cpu_avx512_bf16`: AVX-512 F and BF16 (`vdpbf16ps`);
//! - `cpu_avx512_vnni`: AVX-512 F, BW and VNNI (`vpdpbusd`).
//!
//! Set only when the build runs on the machine it builds for (the tests run there too).

fn main() {
    for cfg in ["cpu_avx2", "cpu_avx512", "cpu_avx512_bf16", "cpu_avx512_vnni"] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    println!("cargo::rerun-if-changed=build.rs");
    let native = std::env::var("HOST").ok() == std::env::var("TARGET").ok();
    if native {
        for cfg in detected() {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn detected() -> Vec<&'static str> {
    use std::arch::is_x86_feature_detected as has;
    let v3 = has!("avx2") && has!("fma") && has!("bmi1") && has!("bmi2") && has!("lzcnt") && has!("popcnt");
    let avx512 = v3 && has!("avx512f") && has!("avx512bw") && has!("avx512cd") && has!("avx512dq") && has!("avx512vl");
    let mut found = Vec::new();
    if has!("avx2") && has!("fma") && has!("f16c") {
        found.push("cpu_avx2");
    }
    if avx512 {
        found.push("cpu_avx512");
    }
    if has!("avx512f") && has!("avx512bf16") {
        found.push("cpu_avx512_bf16");
    }
    if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
        found.push("cpu_avx512_vnni");
    }
    found
}

#[cfg(not(target_arch = "x86_64"))]
fn detected() -> Vec<&'static str> {
    Vec::new()
}
