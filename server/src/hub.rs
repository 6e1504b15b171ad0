//! Models by name: `--model org/repo[:QUANT]` (a GGUF repo's file of that quantization, or a
//! Hugging Face checkpoint's files) and `--model hf://org/repo/path/file.gguf`, resolved through
//! the Hugging Face hub's HTTP protocol into its standard cache (`$HF_HOME/hub`, the layout the
//! Python `huggingface_hub` shares: `models--org--repo/{blobs,snapshots/COMMIT,refs}`).
//! `HF_ENDPOINT` and `HF_TOKEN` are honoured; downloads resume from a partial blob, show their
//! progress on stderr and are checked against the hub's sha256; offline (`--offline`,
//! `HF_HUB_OFFLINE=1`), or when the hub cannot be reached, the cache alone answers. A path that
//! exists is always a path.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use llaisys_model::gguf::{split_name, split_part};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Where and how to reach the hub.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// `HF_ENDPOINT`, else `https://huggingface.co`.
    pub endpoint: String,
    /// The hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub cache: PathBuf,
    /// `HF_TOKEN`, sent as a bearer token.
    pub token: Option<String>,
    /// Use the cache only.
    pub offline: bool,
}

impl HubConfig {
    /// From the environment, as `huggingface_hub` reads it; `offline` also when
    /// `HF_HUB_OFFLINE` is `1`.
    pub fn from_env(offline: bool) -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let user =
                var("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")));
            user.unwrap_or_else(|| PathBuf::from(".cache")).join("huggingface")
        });
        Self {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .into(),
            cache: var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| home.join("hub")),
            token: var("HF_TOKEN"),
            offline: offline || matches!(var("HF_HUB_OFFLINE").as_deref(), Some("1" | "true" | "yes")),
        }
    }
}

/// What `--model` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// A file or directory on this machine.
    Path(PathBuf),
    /// A repo, and the quantization to pick among its GGUF files.
    Repo { repo: String, quant: Option<String> },
    /// One file of a repo.
    File { repo: String, file: String },
}

impl ModelSpec {
    /// An existing path is a path; `hf://org/repo/file` a file; `org/repo[:QUANT]` a repo.
    pub fn parse(spec: &str) -> Self {
        if let Some(rest) = spec.strip_prefix("hf://") {
            let mut parts = rest.splitn(3, '/');
            if let (Some(org), Some(name), Some(file)) = (parts.next(), parts.next(), parts.next()) {
                return Self::File { repo: format!("{org}/{name}"), file: file.into() };
            }
        }
        let path = Path::new(spec);
        let (repo, quant) = match spec.split_once(':') {
            Some((repo, quant)) => (repo, Some(quant.to_string())),
            None => (spec, None),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        let named = parts.len() == 2
            && parts.iter().all(|p| !p.is_empty() && !p.starts_with('.'))
            && repo.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
        let file_like = [".gguf", ".safetensors", ".json"].iter().any(|e| spec.to_ascii_lowercase().ends_with(e));
        if path.exists() || !named || file_like {
            return Self::Path(path.into());
        }
        Self::Repo { repo: repo.into(), quant: quant.filter(|q| !q.is_empty()) }
    }

    /// The name clients use for a model given by name (the spec as typed); `None` for a path.
    pub fn served_name(spec: &str) -> Option<String> {
        match Self::parse(spec) {
            Self::Path(_) => None,
            _ => Some(spec.strip_prefix("hf://").unwrap_or(spec).to_string()),
        }
    }
}

/// Why a model could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    NotFound(String),
    /// The choice among a repo's files is missing or ambiguous.
    #[error("{0}")]
    Choice(String),
    #[error("{what}: {reason}")]
    Http { what: String, reason: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{file}: its sha256 is {got}, the hub says {want}; the download was removed")]
    Checksum { file: String, got: String, want: String },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io { path: path.into(), source }
}

/// A file of a repo as the hub lists it.
#[derive(Debug, Clone, Deserialize)]
struct Sibling {
    rfilename: String,
    #[serde(default)]
    lfs: Option<Lfs>,
}

#[derive(Debug, Clone, Deserialize)]
struct Lfs {
    sha256: String,
}

#[derive(Debug, Deserialize)]
struct RepoInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

/// The files of a Hugging Face checkpoint directory that loading reads (the chat template may be
/// a `chat_template.jinja` of its own).
fn is_checkpoint_file(name: &str) -> bool {
    !name.contains('/') && (name.ends_with(".safetensors") || name.ends_with(".json") || name == "chat_template.jinja")
        || name == "1_Pooling/config.json"
}

/// Where a model is on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The GGUF file (a split one's first part) or checkpoint directory.
    pub path: PathBuf,
    /// A GGUF repo's projector file (its vision tower, `mmproj-*.gguf`), where it has one.
    pub mmproj: Option<PathBuf>,
}

/// The local path of what `spec` names: itself if a path; else the cached (or downloaded) GGUF
/// file or checkpoint directory. A GGUF repo's projector file comes with its model, as llama.cpp's
/// `-hf` takes it: the one of the quantization asked for, else F16, BF16, F32 or Q8_0.
pub async fn resolve(spec: &str, hub: &HubConfig) -> Result<Resolved, HubError> {
    let (repo, want) = match ModelSpec::parse(spec) {
        ModelSpec::Path(path) => return Ok(Resolved { path, mmproj: None }),
        ModelSpec::Repo { repo, quant } => (repo, Want::Quant(quant)),
        ModelSpec::File { repo, file } => (repo, Want::File(file)),
    };
    let store = Store { root: hub.cache.join(format!("models--{}", repo.replace('/', "--"))) };
    if hub.offline {
        return store.cached(&repo, &want, "offline (--offline or HF_HUB_OFFLINE)");
    }
    let client = Client::new(hub)?;
    let info = match client.info(&repo).await {
        Ok(info) => info,
        Err(HubError::Http { what, reason }) => {
            tracing::warn!(%what, %reason, "the hub cannot be reached; using the cache");
            return store.cached(&repo, &want, &format!("the hub cannot be reached ({reason})"));
        }
        Err(e) => return Err(e),
    };
    let names: Vec<String> = info.siblings.iter().map(|s| s.rfilename.clone()).collect();
    let chosen = want.choose(&repo, &names)?;
    for file in &chosen.files {
        let sibling = info.siblings.iter().find(|s| &s.rfilename == file).expect("a listed file");
        store.fetch(&client, &repo, &info.sha, sibling).await?;
    }
    store.set_ref("main", &info.sha)?;
    Ok(chosen.at(&store.snapshot(&info.sha)))
}

/// What to take from a repo.
enum Want {
    Quant(Option<String>),
    File(String),
}

/// The files to fetch and the path (in the snapshot) to load, with its projector file.
struct Chosen {
    files: Vec<String>,
    path: String,
    mmproj: Option<String>,
}

impl Chosen {
    fn at(&self, snapshot: &Path) -> Resolved {
        Resolved { path: snapshot.join(&self.path), mmproj: self.mmproj.as_ref().map(|m| snapshot.join(m)) }
    }
}

/// Whether a repo's file is a projector file (llama.cpp's `mmproj-*.gguf`), not a model.
fn is_projector(name: &str) -> bool {
    name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase().starts_with("mmproj")
}

impl Want {
    fn choose(&self, repo: &str, names: &[String]) -> Result<Chosen, HubError> {
        let quant = match self {
            Want::File(file) => {
                return match names.iter().any(|n| n == file) {
                    true => Ok(Chosen { files: vec![file.clone()], path: file.clone(), mmproj: None }),
                    false => Err(HubError::NotFound(format!("the repo {repo} has no file {file}"))),
                };
            }
            Want::Quant(q) => q,
        };
        let (mut projectors, ggufs): (Vec<&String>, Vec<&String>) =
            names.iter().filter(|n| n.to_ascii_lowercase().ends_with(".gguf")).partition(|n| is_projector(n));
        if ggufs.is_empty() && !projectors.is_empty() {
            return Err(HubError::NotFound(format!("the repo {repo} has projector (mmproj) files but no GGUF model")));
        }
        if ggufs.is_empty() {
            if let Some(q) = quant {
                return Err(HubError::Choice(format!("the repo {repo} has no GGUF files, so no quantization {q}")));
            }
            // A model's checkpoint, or a PEFT adapter's directory.
            if !names.iter().any(|n| n == "config.json" || n == "adapter_config.json") {
                return Err(HubError::NotFound(format!(
                    "the repo {repo} has neither GGUF files nor a config.json (nor an adapter's adapter_config.json)"
                )));
            }
            let files = names.iter().filter(|n| is_checkpoint_file(n)).cloned().collect();
            return Ok(Chosen { files, path: String::new(), mmproj: None });
        }
        let listing = || ggufs.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
        let models = gguf_models(&ggufs);
        let matching: Vec<&Vec<String>> = match quant {
            Some(q) => models.iter().filter(|m| has_quant(&m[0], q)).collect(),
            None if models.len() == 1 => models.iter().collect(),
            // llama.cpp's default choice.
            None => models.iter().filter(|m| has_quant(&m[0], "Q4_K_M")).collect(),
        };
        let mut files = match (matching.as_slice(), quant) {
            ([one], _) => (*one).clone(),
            ([], Some(q)) => {
                return Err(HubError::Choice(format!("the repo {repo} has no {q} GGUF; it has: {}", listing())));
            }
            ([], None) => {
                return Err(HubError::Choice(format!(
                    "the repo {repo} has several GGUF files: name one as {repo}:QUANT; it has: {}",
                    listing()
                )));
            }
            (several, _) => {
                // One whole file beside split ones of the same quantization.
                let whole: Vec<&&Vec<String>> = several.iter().filter(|m| m.len() == 1).collect();
                match whole.as_slice() {
                    [one] => (**one).clone(),
                    _ => {
                        let names: Vec<&str> = several.iter().map(|m| m[0].as_str()).collect();
                        return Err(HubError::Choice(format!(
                            "several files of {repo} match: {}; name one as hf://{repo}/FILE",
                            names.join(", ")
                        )));
                    }
                }
            }
        };
        if let Some((prefix, _, count)) = split_part(&files[0])
            && files.len() < count
        {
            let missing: Vec<String> =
                (1..=count).map(|no| split_name(prefix, no, count)).filter(|n| !files.contains(n)).collect();
            return Err(HubError::NotFound(format!(
                "{} of {repo} is split into {count} parts, and the repo lacks {}",
                files[0],
                missing.join(", ")
            )));
        }
        let preferred = quant.iter().map(String::as_str).chain(["F16", "BF16", "F32", "Q8_0"]);
        projectors.sort();
        let mmproj = preferred
            .filter_map(|q| projectors.iter().find(|p| has_quant(p, q)))
            .next()
            .or(projectors.first())
            .map(|p| (*p).clone());
        let path = files[0].clone();
        files.extend(mmproj.clone());
        Ok(Chosen { path, files, mmproj })
    }
}

/// The models among a repo's GGUF files: one whole file, or the parts of a split one (as
/// llama.cpp's `gguf-split` names them), first part first.
fn gguf_models(ggufs: &[&String]) -> Vec<Vec<String>> {
    let mut models: Vec<Vec<String>> = Vec::new();
    let mut parts: Vec<&String> = ggufs.iter().copied().filter(|n| split_part(n).is_some()).collect();
    parts.sort_by_key(|n| split_part(n).map(|(prefix, no, count)| (prefix.to_string(), count, no)));
    for name in parts {
        let (prefix, _, count) = split_part(name).expect("a part");
        match models.last_mut() {
            Some(model) if split_part(&model[0]).is_some_and(|(p, _, c)| p == prefix && c == count) => {
                model.push(name.clone())
            }
            _ => models.push(vec![name.clone()]),
        }
    }
    models.extend(ggufs.iter().filter(|n| split_part(n).is_none()).map(|n| vec![(*n).clone()]));
    models
}

/// Whether a file name carries quantization `quant` as a whole word (`Q4_K_M` is not in
/// `Q4_K_M_L`, `Q4_K` is not in `Q4_K_M`).
fn has_quant(name: &str, quant: &str) -> bool {
    let (name, quant) = (name.to_ascii_uppercase(), quant.to_ascii_uppercase());
    let file = name.rsplit('/').next().unwrap_or(&name);
    file.match_indices(&quant).any(|(at, _)| {
        let before = file[..at].chars().last();
        let after = file[at + quant.len()..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_');
        boundary(before) && boundary(after)
    })
}

/// One repo's part of the cache.
struct Store {
    root: PathBuf,
}

impl Store {
    fn snapshot(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    fn set_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        let path = self.root.join("refs").join(revision);
        std::fs::create_dir_all(self.root.join("refs")).map_err(io(&path))?;
        std::fs::write(&path, commit).map_err(io(&path))
    }

    /// What the cache holds for `want`, without the hub (`why` says why not).
    fn cached(&self, repo: &str, want: &Want, why: &str) -> Result<Resolved, HubError> {
        let missing =
            || HubError::NotFound(format!("{repo} is not in the hub cache {} and {why}", self.root.display()));
        let commit = std::fs::read_to_string(self.root.join("refs/main")).map_err(|_| missing())?;
        let snapshot = self.snapshot(commit.trim());
        let mut names = Vec::new();
        list(&snapshot, "", &mut names);
        if names.is_empty() {
            return Err(missing());
        }
        let chosen = want.choose(repo, &names)?;
        for file in &chosen.files {
            if !snapshot.join(file).exists() {
                return Err(missing());
            }
        }
        Ok(chosen.at(&snapshot))
    }

    /// Downloads one file into the cache (resuming a partial blob), checks it, links it into
    /// the snapshot; nothing to do when the snapshot has it.
    async fn fetch(&self, client: &Client, repo: &str, commit: &str, sibling: &Sibling) -> Result<(), HubError> {
        let file = &sibling.rfilename;
        let target = self.snapshot(commit).join(file);
        if target.exists() {
            return Ok(());
        }
        let blobs = self.root.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(io(&blobs))?;
        let want = sibling.lfs.as_ref().map(|l| l.sha256.to_ascii_lowercase());
        let name = want.clone().unwrap_or_else(|| format!("nolfs-{}", file.replace('/', "--")));
        let blob = blobs.join(&name);
        if !blob.exists() {
            let partial = blobs.join(format!("{name}.incomplete"));
            let sha = client.download(repo, commit, file, &partial).await?;
            if let Some(want) = &want
                && *want != sha
            {
                let _ = std::fs::remove_file(&partial);
                return Err(HubError::Checksum { file: format!("{repo}/{file}"), got: sha, want: want.clone() });
            }
            std::fs::rename(&partial, &blob).map_err(io(&blob))?;
        }
        let parent = target.parent().expect("a snapshot file's folder");
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        link(&blob, &target)
    }
}

/// Links `target` to `blob` (relative, as `huggingface_hub` does), or copies where links fail.
fn link(blob: &Path, target: &Path) -> Result<(), HubError> {
    let depth = target
        .strip_prefix(blob.parent().and_then(Path::parent).unwrap_or(Path::new("")))
        .map_or(0, |p| p.components().count());
    let mut relative = PathBuf::new();
    for _ in 1..depth {
        relative.push("..");
    }
    relative.push("blobs");
    relative.push(blob.file_name().expect("a blob's name"));
    #[cfg(unix)]
    if std::os::unix::fs::symlink(&relative, target).is_ok() {
        return Ok(());
    }
    std::fs::copy(blob, target).map(|_| ()).map_err(io(target))
}

/// The files under `dir`, relative, with `/`.
fn list(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        if entry.path().is_dir() {
            list(&entry.path(), &format!("{name}/"), out);
        } else {
            out.push(name);
        }
    }
}

/// The hub's HTTP side.
struct Client {
    http: reqwest::Client,
    endpoint: String,
    token: Option<String>,
}

impl Client {
    fn new(hub: &HubConfig) -> Result<Self, HubError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("llaisys/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HubError::Http { what: "the HTTP client".into(), reason: e.to_string() })?;
        Ok(Self { http, endpoint: hub.endpoint.clone(), token: hub.token.clone() })
    }

    fn get(&self, url: &str) -> reqwest::RequestBuilder {
        let request = self.http.get(url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// The repo's files and current commit.
    async fn info(&self, repo: &str) -> Result<RepoInfo, HubError> {
        let url = format!("{}/api/models/{repo}/revision/main?blobs=true", self.endpoint);
        let failed = |reason: String| HubError::Http { what: url.clone(), reason };
        let response = self.get(&url).send().await.map_err(|e| failed(e.to_string()))?;
        match response.status().as_u16() {
            200 => response.json().await.map_err(|e| failed(format!("the listing is not the hub's JSON: {e}"))),
            401 | 403 => Err(HubError::NotFound(format!(
                "{repo} on {}: access refused (a gated or private repo needs HF_TOKEN)",
                self.endpoint
            ))),
            404 => Err(HubError::NotFound(format!(
                "no model repo {repo} on {} (and no file or directory {repo} here)",
                self.endpoint
            ))),
            status => Err(failed(format!("HTTP {status}"))),
        }
    }

    /// Downloads `file` at `commit` into `partial` (appending to what it holds); its sha256.
    async fn download(&self, repo: &str, commit: &str, file: &str, partial: &Path) -> Result<String, HubError> {
        let url = format!("{}/{repo}/resolve/{commit}/{file}", self.endpoint);
        let failed = |reason: String| HubError::Http { what: url.clone(), reason };
        let have = std::fs::metadata(partial).map_or(0, |m| m.len());
        let mut request = self.get(&url);
        if have > 0 {
            request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let response = request.send().await.map_err(|e| failed(e.to_string()))?;
        let status = response.status().as_u16();
        let resumed = status == 206;
        if !(status == 200 || resumed) {
            return Err(failed(format!("HTTP {status}")));
        }
        let mut hasher = Sha256::new();
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(resumed)
            .write(true)
            .truncate(!resumed)
            .open(partial)
            .map_err(io(partial))?;
        let mut done = 0;
        if resumed {
            // The bytes already there count toward the hash.
            let mut kept = std::fs::File::open(partial).map_err(io(partial))?;
            std::io::copy(&mut kept, &mut HashWriter(&mut hasher)).map_err(io(partial))?;
            done = have;
        }
        let total = response.content_length().map(|n| n + done);
        let mut progress = Progress::new(file, total, done);
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| failed(format!("the download broke off: {e}")))?;
            out.write_all(&chunk).map_err(io(partial))?;
            hasher.update(&chunk);
            done += chunk.len() as u64;
            progress.show(done);
        }
        out.flush().map_err(io(partial))?;
        progress.end(done);
        Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A download's progress on stderr: a line redrawn on a terminal, a line per tenth otherwise.
struct Progress<'a> {
    file: &'a str,
    total: Option<u64>,
    start: Instant,
    started_at: u64,
    last: Instant,
    tenth: u64,
    terminal: bool,
}

impl<'a> Progress<'a> {
    fn new(file: &'a str, total: Option<u64>, done: u64) -> Self {
        let now = Instant::now();
        let terminal = std::io::stderr().is_terminal();
        Self { file, total, start: now, started_at: done, last: now, tenth: 0, terminal }
    }

    fn line(&self, done: u64) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let rate = mb(done - self.started_at) / self.start.elapsed().as_secs_f64().max(1e-3);
        match self.total {
            Some(t) if t > 0 => {
                format!("{}: {:5.1}% of {:.1} MB, {rate:.1} MB/s", self.file, 100.0 * done as f64 / t as f64, mb(t))
            }
            _ => format!("{}: {:.1} MB, {rate:.1} MB/s", self.file, mb(done)),
        }
    }

    fn show(&mut self, done: u64) {
        if self.terminal {
            if self.last.elapsed() >= Duration::from_millis(200) {
                self.last = Instant::now();
                eprint!("\r{}", self.line(done));
            }
        } else if let Some(t) = self.total.filter(|t| *t > 0) {
            let tenth = done * 10 / t;
            if tenth > self.tenth {
                self.tenth = tenth;
                eprintln!("{}", self.line(done));
            }
        }
    }

    fn end(&self, done: u64) {
        if self.terminal {
            eprintln!("\r{}", self.line(done));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_paths_repos_or_files() {
        assert_eq!(
            ModelSpec::parse("Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M"),
            ModelSpec::Repo { repo: "Qwen/Qwen2.5-0.5B-Instruct-GGUF".into(), quant: Some("Q4_K_M".into()) }
        );
        assert_eq!(ModelSpec::parse("org/repo"), ModelSpec::Repo { repo: "org/repo".into(), quant: None });
        assert_eq!(
            ModelSpec::parse("hf://org/repo/sub/m.gguf"),
            ModelSpec::File { repo: "org/repo".into(), file: "sub/m.gguf".into() }
        );
        for path in ["models/x.gguf", "./a/b", "/abs/path", "model.gguf", "a/b/c", "dir/model.safetensors"] {
            assert_eq!(ModelSpec::parse(path), ModelSpec::Path(path.into()), "{path}");
        }
        let here = env!("CARGO_MANIFEST_DIR");
        assert_eq!(ModelSpec::parse(here), ModelSpec::Path(here.into()), "an existing path is a path");
    }

    /// A checkpoint's download takes its weights, its JSON files (config, tokenizer, templates)
    /// and a chat template of its own, not its other files.
    #[test]
    fn a_checkpoints_download_takes_what_loading_reads() {
        for name in ["model-00001-of-00002.safetensors", "config.json", "chat_template.jinja", "chat_template.json"] {
            assert!(is_checkpoint_file(name), "{name}");
        }
        assert!(is_checkpoint_file("1_Pooling/config.json"));
        for name in ["README.md", "onnx/model.onnx", "original/params.json", "tokenizer.model"] {
            assert!(!is_checkpoint_file(name), "{name}");
        }
    }

    #[test]
    fn quantizations_match_whole_words() {
        assert!(has_quant("qwen2.5-0.5b-instruct-q4_k_m.gguf", "Q4_K_M"));
        assert!(!has_quant("qwen2.5-0.5b-instruct-q4_k_m.gguf", "Q4_K"));
        assert!(has_quant("Model-Q8_0.gguf", "q8_0"));
        assert!(!has_quant("Model-IQ4_XS.gguf", "Q4_XS") && has_quant("Model-IQ4_XS.gguf", "IQ4_XS"));
    }

    #[test]
    fn split_models_are_chosen_whole_and_an_incomplete_one_is_named() {
        let names: Vec<String> =
            ["big-Q4_K_M-00002-of-00002.gguf", "big-Q4_K_M-00001-of-00002.gguf", "big-Q8_0.gguf", "README.md"]
                .map(String::from)
                .into();
        let chosen = Want::Quant(Some("Q4_K_M".into())).choose("o/r", &names).unwrap();
        assert_eq!(chosen.path, "big-Q4_K_M-00001-of-00002.gguf");
        assert_eq!(chosen.files, ["big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf"]);
        assert_eq!(Want::Quant(Some("Q8_0".into())).choose("o/r", &names).unwrap().files, ["big-Q8_0.gguf"]);
        let err = Want::Quant(Some("Q4_K_M".into())).choose("o/r", &names[1..]).err().unwrap().to_string();
        assert!(err.contains("split into 2 parts") && err.contains("big-Q4_K_M-00002-of-00002.gguf"), "{err}");
    }

    #[test]
    fn a_vision_models_projector_file_comes_with_it_and_is_never_taken_for_a_model() {
        let names: Vec<String> = [
            "Qwen2.5-VL-3B-Instruct-Q4_K_M.gguf",
            "Qwen2.5-VL-3B-Instruct-Q8_0.gguf",
            "mmproj-Qwen2.5-VL-3B-Instruct-Q8_0.gguf",
            "mmproj-Qwen2.5-VL-3B-Instruct-f16.gguf",
        ]
        .map(String::from)
        .into();
        // The quantization asked for, the projector of that quantization.
        let chosen = Want::Quant(Some("Q8_0".into())).choose("o/r", &names).unwrap();
        assert_eq!(chosen.path, "Qwen2.5-VL-3B-Instruct-Q8_0.gguf");
        assert_eq!(chosen.mmproj.as_deref(), Some("mmproj-Qwen2.5-VL-3B-Instruct-Q8_0.gguf"));
        assert_eq!(chosen.files.len(), 2);
        // Else the 16-bit one.
        let chosen = Want::Quant(None).choose("o/r", &names).unwrap();
        assert_eq!(chosen.path, "Qwen2.5-VL-3B-Instruct-Q4_K_M.gguf");
        assert_eq!(chosen.mmproj.as_deref(), Some("mmproj-Qwen2.5-VL-3B-Instruct-f16.gguf"));
        // A repo of one model and its projector: the model, whatever is asked.
        let one = [names[0].clone(), names[3].clone()];
        let chosen = Want::Quant(None).choose("o/r", &one).unwrap();
        assert_eq!((chosen.path.as_str(), chosen.mmproj.as_deref()), (one[0].as_str(), Some(one[1].as_str())));
        // A named file comes alone; a repo of projectors only has no model.
        assert_eq!(Want::File(names[0].clone()).choose("o/r", &names).unwrap().mmproj, None);
        let err = Want::Quant(None).choose("o/r", &names[2..]).err().unwrap().to_string();
        assert!(err.contains("no GGUF model"), "{err}");
    }
}
