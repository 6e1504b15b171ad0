//! The stable-toolchain fuzz driver: mutates a target's corpus (`corpus/TARGET/`) for a given
//! time, runs each input through the target, and saves any input that panics (or runs past
//! `SLOW`) to `artifacts/TARGET/`. Not coverage-guided (libFuzzer needs nightly: `libfuzzer/`),
//! but structure-aware: each target has a dictionary of the tokens its format is made of, and
//! numbers are mutated toward the values that break parsers (0, 1, 255, 2^31, 2^32 − 1, huge).
//!
//! `llaisys-fuzz TARGET SECONDS [SEED]` (or `all`); exits 1 if anything was found.
//! `llaisys-fuzz TARGET replay FILE...` runs saved inputs once each and says which panic.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use llaisys_fuzz::{TARGETS, Target, target};

/// An input slower than this is saved as a finding (a hang in waiting).
const SLOW: Duration = Duration::from_secs(2);
/// Mutated inputs are kept below this size.
const MAX_LEN: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let (Some(t), Some("replay")) = (args.first().and_then(|n| target(n)), args.get(1).map(String::as_str)) {
        let failed = args[2..].iter().filter(|file| !replay(t, Path::new(file))).count();
        std::process::exit(i32::from(failed > 0));
    }
    let (Some(name), Some(seconds)) = (args.first(), args.get(1).and_then(|s| s.parse::<u64>().ok())) else {
        eprintln!("usage: llaisys-fuzz TARGET|all SECONDS [SEED]; targets: {}", names());
        std::process::exit(2);
    };
    let seed = args.get(2).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let targets: Vec<&Target> = match name.as_str() {
        "all" => TARGETS.iter().collect(),
        name => match target(name) {
            Some(t) => vec![t],
            None => {
                eprintln!("no target '{name}'; targets: {}", names());
                std::process::exit(2);
            }
        },
    };
    // Panics are findings, reported once each below, not printed as they happen.
    std::panic::set_hook(Box::new(|_| {}));
    let mut found = 0;
    for t in targets {
        found += fuzz(t, Duration::from_secs(seconds), seed);
    }
    std::process::exit(i32::from(found > 0));
}

/// Runs one saved input; false if it panics.
fn replay(t: &Target, file: &Path) -> bool {
    let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    match catch_unwind(AssertUnwindSafe(|| (t.run)(&data))) {
        Ok(()) => true,
        Err(panic) => {
            eprintln!("{}: {}", file.display(), message(&panic));
            false
        }
    }
}

fn names() -> String {
    TARGETS.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Fuzzes `t` for `time`; returns how many findings it saved.
fn fuzz(t: &Target, time: Duration, seed: u64) -> usize {
    let corpus = read_corpus(&root().join("corpus").join(t.name));
    let mut rng = Rng(seed | 1);
    let dictionary = dictionary(t.name);
    let (start, mut runs, mut found) = (Instant::now(), 0u64, 0);
    while start.elapsed() < time {
        let mut input = match corpus.is_empty() {
            true => Vec::new(),
            false => corpus[rng.below(corpus.len())].clone(),
        };
        for _ in 0..1 + rng.below(8) {
            // JSON inputs mostly change as JSON (a value at a time), so they get past the parser.
            let structural = t.name == "openai_request" && rng.below(4) != 0;
            if !(structural && mutate_json(&mut input, dictionary, &mut rng)) {
                mutate(&mut input, &corpus, dictionary, &mut rng);
            }
        }
        let began = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| (t.run)(&input)));
        let took = began.elapsed();
        runs += 1;
        let finding = match outcome {
            Err(panic) => Some(format!("panic: {}", message(&panic))),
            Ok(()) if took > SLOW => Some(format!("slow: {} ms", took.as_millis())),
            Ok(()) => None,
        };
        if let Some(what) = finding {
            let path = save(t.name, &input);
            eprintln!("{}: {what}; input saved to {}", t.name, path.display());
            found += 1;
            if found >= 10 {
                break;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!("{}: {runs} inputs in {secs:.0} s ({:.0}/s), {found} findings (seed {seed})", t.name, runs as f64 / secs);
    found
}

fn read_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
    files.sort();
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

fn save(target: &str, input: &[u8]) -> PathBuf {
    let dir = root().join("artifacts").join(target);
    let _ = std::fs::create_dir_all(&dir);
    let hash = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3));
    let path = dir.join(format!("finding-{hash:016x}"));
    let _ = std::fs::write(&path, input);
    path
}

fn message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The tokens each target's format is made of.
fn dictionary(target: &str) -> &'static [&'static [u8]] {
    match target {
        "gguf" => &[
            b"GGUF",
            b"general.architecture",
            b"qwen2",
            b"qwen2.block_count",
            b"qwen2.embedding_length",
            b"qwen2.attention.head_count",
            b"tokenizer.ggml.tokens",
            b"tokenizer.ggml.merges",
            b"tokenizer.ggml.pre",
            b"tokenizer.chat_template",
            b"token_embd.weight",
            b"blk.0.attn_q.weight",
            b"output.weight",
        ],
        "openai_request" => &[
            b"{",
            b"}",
            b"[",
            b"]",
            b"\"",
            b":",
            b",",
            b"null",
            b"true",
            b"-1",
            b"1e308",
            b"\"\\u0000\"",
            b"\"messages\"",
            b"\"role\"",
            b"\"content\"",
            b"\"tools\"",
            b"\"tool_choice\"",
            b"\"tool_calls\"",
            b"\"function\"",
            b"\"arguments\"",
            b"\"response_format\"",
            b"\"json_schema\"",
            b"\"structured_outputs\"",
            b"\"regex\"",
            b"\"grammar\"",
            b"\"logit_bias\"",
            b"\"max_tokens\"",
            b"\"prompt\"",
            b"\"stop\"",
            b"\"n\"",
            b"\"session_id\"",
            b"\"logprobs\"",
            b"\"top_logprobs\"",
        ],
        "chat_template" => &[
            b"\n",
            b"|",
            b"system",
            b"user",
            b"assistant",
            b"tool",
            b"developer",
            b"{{",
            b"}}",
            b"{%",
            b"%}",
            b"<|im_start|>",
            b"<|im_end|>",
            b"<tool_call>",
            b"{\"a\": 1}",
        ],
        "tool_calls" => &[b"\x01", b"\x02", b"{", b"}", b"\"", b"\\", b":", b",", b"\"name\"", b"\"arguments\""],
        "reasoning" => &[b"\x01", b"\x02", b"\n", b" ", b"\t", b"\n\n", b"\xc2\xa0", b"\xe3\x80\x80"],
        _ => &[],
    }
}

/// Numbers that break parsers, as little-endian bytes.
const INTERESTING: [u64; 9] = [0, 1, 0x7f, 0xff, 0xffff, 0x7fff_ffff, 0xffff_ffff, 1 << 40, u64::MAX];

fn mutate(input: &mut Vec<u8>, corpus: &[Vec<u8>], dictionary: &[&[u8]], rng: &mut Rng) {
    let len = input.len();
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len);
            input[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            input[i] = rng.next() as u8;
        }
        2 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            input.splice(at..at, bytes);
        }
        3 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(64));
            input.drain(at..at + n);
        }
        4 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(64));
            let copy = input[at..at + n].to_vec();
            let to = rng.below(len + 1);
            input.splice(to..to, copy);
        }
        5 if !corpus.is_empty() => {
            let other = &corpus[rng.below(corpus.len())];
            if !other.is_empty() {
                let at = rng.below(other.len());
                let cut = rng.below(len + 1);
                input.truncate(cut);
                input.extend_from_slice(&other[at..]);
            }
        }
        6 if !dictionary.is_empty() => {
            let token = dictionary[rng.below(dictionary.len())];
            let at = rng.below(len + 1);
            input.splice(at..at, token.iter().copied());
        }
        7 if len >= 8 => {
            let width = [1, 2, 4, 8][rng.below(4)];
            let at = rng.below(len - width + 1);
            let value = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
            input[at..at + width].copy_from_slice(&value[..width]);
        }
        _ if len > 1 => {
            let at = rng.below(len);
            input.truncate(at.max(1));
        }
        _ => input.push(rng.next() as u8),
    }
    input.truncate(MAX_LEN);
}

/// Changes one value of a JSON input (replaced by another type, an extreme number, a hostile
/// string, emptied, duplicated or removed); false when the input is not JSON.
fn mutate_json(input: &mut Vec<u8>, dictionary: &[&[u8]], rng: &mut Rng) -> bool {
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(input) else { return false };
    let mut count = 0;
    visit(&mut value, &mut |_| count += 1);
    let mut target = rng.below(count);
    let replacement = random_value(dictionary, rng);
    let token = dictionary.get(rng.below(dictionary.len().max(1))).copied().unwrap_or(b"k");
    let new_key = String::from_utf8_lossy(token).trim_matches('"').to_string();
    let mut action = rng.below(4);
    visit(&mut value, &mut |v| {
        if target == 0 {
            match (action, &mut *v) {
                (0, serde_json::Value::Array(items)) if !items.is_empty() => {
                    let i = items.len() - 1;
                    items.push(items[i].clone());
                }
                (1, serde_json::Value::Object(map)) if !map.is_empty() => {
                    let key = map.keys().next().cloned().unwrap_or_default();
                    map.remove(&key);
                }
                (2, serde_json::Value::Object(map)) => {
                    map.insert(new_key.clone(), replacement.clone());
                }
                _ => *v = replacement.clone(),
            }
            action = usize::MAX;
        }
        target = target.wrapping_sub(1);
    });
    *input = serde_json::to_vec(&value).unwrap_or_default();
    true
}

/// Calls `f` on every value of `v`, parents first.
fn visit(v: &mut serde_json::Value, f: &mut dyn FnMut(&mut serde_json::Value)) {
    f(v);
    match v {
        serde_json::Value::Array(items) => items.iter_mut().for_each(|i| visit(i, f)),
        serde_json::Value::Object(map) => map.values_mut().for_each(|i| visit(i, f)),
        _ => {}
    }
}

fn random_value(dictionary: &[&[u8]], rng: &mut Rng) -> serde_json::Value {
    use serde_json::{Value, json};
    match rng.below(9) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => json!(INTERESTING[rng.below(INTERESTING.len())]),
        3 => json!(-(INTERESTING[rng.below(INTERESTING.len())] as i64)),
        4 => json!([1e308, -1.5, 0.0][rng.below(3)]),
        5 => json!([]),
        6 => json!({}),
        7 => {
            let token = dictionary.get(rng.below(dictionary.len().max(1))).copied().unwrap_or(b"x");
            Value::String(String::from_utf8_lossy(token).trim_matches('"').to_string())
        }
        _ => {
            let pieces = ["", "\u{0}", "{{ x }}", "{% if %}", "<|im_end|>", "\n", "é", "🦀", "\"", "a"];
            let n = 1 + rng.below(6);
            Value::String((0..n).map(|_| pieces[rng.below(pieces.len())]).collect())
        }
    }
}

/// xorshift64*: enough randomness for mutations, reproducible from the seed it prints.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
