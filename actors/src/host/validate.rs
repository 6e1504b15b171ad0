//! The checks every request passes before the engine takes it, and their result: a
//! `ValidRequest`, the only request type `Engine::submit` (and, per choice, a scheduler) accepts.
//! Nothing downstream checks again: the scheduler's policy relies on what is proven here (a
//! prompt that is not empty, fits the context and the KV cache, tokens inside the vocabulary,
//! parameters in range, a sane session id).

use std::sync::Arc;

use llaisys_model::ModelInfo;

use super::params::GenerateParams;
use super::request::RequestError;

/// The limits one request is checked against: the model's sizes, the engine's KV cache and the
/// server's request limits.
#[derive(Debug, Clone)]
pub(crate) struct Bounds<'a> {
    pub info: &'a ModelInfo,
    /// Cells of the KV cache the request will run in (`None` where it is not known: a
    /// cluster's front, whose nodes check again).
    pub kv_capacity: Option<usize>,
    /// Longest prompt in tokens (the context length − 1 at most).
    pub max_prompt: usize,
    /// The ids that end a choice unless it ignores them: the model's and its generation
    /// config's end tokens.
    pub eos: &'a [u32],
}

/// A request before its checks: what the `Frontend` made of the request's input and options.
#[derive(Debug)]
pub(crate) struct Unchecked {
    pub prompts: Vec<Vec<u32>>,
    pub params: GenerateParams,
    pub n: usize,
    pub session: Option<String>,
    pub logprobs: bool,
}

/// A request that passed every check: its prompts as token ids, `n` choices each, and the
/// parameters every choice runs with. Made only by the `Frontend`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    prompts: Vec<Vec<u32>>,
    params: GenerateParams,
    n: usize,
    session: Option<String>,
    logprobs: bool,
    /// The frontend that checked it (`Engine::submit` refuses a request checked for another
    /// engine's model and limits).
    pub(crate) checked_by: u64,
    /// Fill-in-the-middle context files left out of its prompts for room (`Infill::files`).
    context_left_out: usize,
}

/// One choice of a `ValidRequest`: what a scheduler runs as one sequence. `params` are shared
/// by everyone who needs them (the scheduler's sequence, the worker's sampler, the request
/// actor); `params.stop_token_ids` are every id that ends the choice (the model's end tokens
/// included unless `ignore_eos`).
#[derive(Debug, Clone, PartialEq)]
pub struct ValidChoice {
    pub(crate) prompt: Vec<u32>,
    pub(crate) params: Arc<GenerateParams>,
    /// Only the first choice of a request continues its session: one conversation, one pin.
    pub(crate) session: Option<String>,
}

impl ValidChoice {
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    pub fn params(&self) -> &GenerateParams {
        &self.params
    }

    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }
}

impl Unchecked {
    /// Checks the prompts and parameters against `bounds`; `prompt_param` names the input in
    /// errors. `checked_by` is the checking frontend's id.
    pub(crate) fn check(
        self,
        bounds: &Bounds<'_>,
        prompt_param: &str,
        checked_by: u64,
    ) -> Result<ValidRequest, RequestError> {
        let Unchecked { prompts, mut params, n, session, logprobs } = self;
        check_prompts(&prompts, bounds, prompt_param)?;
        if params.max_tokens == 0 {
            return Err(RequestError::invalid("max_tokens", "max_tokens must be at least 1, got 0"));
        }
        params.sampling.validate(bounds.info.vocab_size).map_err(|e| RequestError::invalid(e.param, e.to_string()))?;
        if let Some(s) = &session {
            check_session_id(s)?;
        }
        if !params.ignore_eos {
            params.stop_token_ids.extend(bounds.eos);
        }
        params.stop_token_ids.sort_unstable();
        params.stop_token_ids.dedup();
        Ok(ValidRequest { prompts, params, n, session, logprobs, checked_by, context_left_out: 0 })
    }
}

impl ValidRequest {
    /// The prompts' token ids (a chat has one).
    pub fn prompts(&self) -> &[Vec<u32>] {
        &self.prompts
    }

    /// The parameters every choice runs with (choice `i` of a prompt adds `i` to the seed).
    pub fn params(&self) -> &GenerateParams {
        &self.params
    }

    /// Fill-in-the-middle context files left out of its prompts for room (the first ones of
    /// `Infill::files`), over all its prompts.
    pub fn context_left_out(&self) -> usize {
        self.context_left_out
    }

    pub(crate) fn with_context_left_out(self, files: usize) -> Self {
        Self { context_left_out: files, ..self }
    }

    /// Choices per prompt.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Whether the choices report log-probabilities.
    pub fn logprobs(&self) -> bool {
        self.logprobs
    }

    /// The conversation it continues.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// Every choice in order (prompt by prompt, `n` each), the seed offset by the choice's index
    /// within its prompt so that choices differ.
    pub fn choices(&self) -> Vec<ValidChoice> {
        let mut choices = Vec::with_capacity(self.prompts.len() * self.n);
        for prompt in &self.prompts {
            for i in 0..self.n {
                let mut params = self.params.clone();
                params.sampling.seed = params.sampling.seed.map(|s| s.wrapping_add(i as u64));
                let session = if choices.is_empty() { self.session.clone() } else { None };
                choices.push(ValidChoice { prompt: prompt.clone(), params: Arc::new(params), session });
            }
        }
        choices
    }
}

/// Every prompt checked (`check_prompt`); with several, an error says which.
pub(crate) fn check_prompts(prompts: &[Vec<u32>], bounds: &Bounds<'_>, prompt_param: &str) -> Result<(), RequestError> {
    if prompts.is_empty() {
        return Err(RequestError::invalid(prompt_param, "the prompt list is empty"));
    }
    let several = prompts.len() > 1;
    for (i, prompt) in prompts.iter().enumerate() {
        check_prompt(prompt, bounds).map_err(|mut e| {
            e.param = Some(prompt_param.into());
            if several {
                e.message = format!("prompt {i}: {}", e.message);
            }
            e
        })?;
    }
    Ok(())
}

/// A prompt the engine can run: not empty, inside the vocabulary, shorter than the context and
/// (with room for one generated token) no larger than the KV cache.
fn check_prompt(prompt: &[u32], bounds: &Bounds<'_>) -> Result<(), RequestError> {
    let invalid = |message: String| RequestError::invalid("prompt", message);
    if prompt.is_empty() {
        return Err(invalid("the prompt is empty".into()));
    }
    let vocab = bounds.info.vocab_size;
    if let Some(bad) = prompt.iter().find(|t| **t as usize >= vocab) {
        return Err(invalid(format!("token id {bad} is not below the vocabulary size {vocab}")));
    }
    let len = prompt.len();
    if len > bounds.max_prompt {
        let message = format!(
            "This model's maximum context length is {} tokens. However, your prompt has {len} tokens.",
            bounds.max_prompt + 1
        );
        return Err(invalid(message).with_code("context_length_exceeded"));
    }
    if let Some(capacity) = bounds.kv_capacity.filter(|c| len + 1 > *c) {
        let message = format!(
            "the prompt has {len} tokens; with room for one generated token it needs {} cells, the KV cache has {capacity}",
            len + 1
        );
        return Err(invalid(message).with_code("context_length_exceeded"));
    }
    Ok(())
}

/// Session ids are chosen by clients: non-empty, at most 256 bytes, no control characters.
fn check_session_id(id: &str) -> Result<(), RequestError> {
    if id.is_empty() || id.len() > 256 || id.chars().any(char::is_control) {
        let shown: String = id.chars().take(64).collect();
        return Err(RequestError::invalid(
            "session_id",
            format!(
                "invalid session id '{}' ({} bytes): a session id has 1 to 256 bytes and no control characters",
                shown.escape_debug(),
                id.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(context_length: usize) -> ModelInfo {
        ModelInfo {
            model_type: "mock",
            vocab_size: 100,
            hidden_size: 8,
            context_length,
            bos_token_id: None,
            eos_token_ids: vec![2],
            pooling: llaisys_model::Pooling::Last,
            state_bytes: 0,
            vision: None,
        }
    }

    fn unchecked(prompts: Vec<Vec<u32>>, params: GenerateParams, n: usize, session: Option<String>) -> Unchecked {
        Unchecked { prompts, params, n, session, logprobs: false }
    }

    fn check(prompt_len: usize, max_tokens: usize, kv: usize, context: usize) -> Result<ValidRequest, RequestError> {
        let info = info(context);
        let bounds = Bounds { info: &info, kv_capacity: Some(kv), max_prompt: context - 1, eos: &[2] };
        let params = GenerateParams { max_tokens, ..GenerateParams::default() };
        unchecked(vec![(0..prompt_len as u32).collect()], params, 1, None).check(&bounds, "prompt", 0)
    }

    /// What the scheduler's policy relies on: a prompt that is not empty, asks for a token,
    /// fits the context and (with one generated token) the KV cache.
    #[test]
    fn a_prompt_that_can_never_run_is_refused_naming_why() {
        let message = |r: Result<ValidRequest, RequestError>| r.unwrap_err().message;
        assert_eq!(
            message(check(10, 4, 10, 1000)),
            "the prompt has 10 tokens; with room for one generated token it needs 11 cells, the KV cache has 10"
        );
        assert_eq!(message(check(0, 4, 10, 1000)), "the prompt is empty");
        assert_eq!(message(check(3, 0, 10, 1000)), "max_tokens must be at least 1, got 0");
        assert_eq!(
            message(check(8, 1, 100, 8)),
            "This model's maximum context length is 8 tokens. However, your prompt has 8 tokens."
        );
        assert_eq!(check(9, 1, 10, 1000).map(|r| r.prompts()[0].len()), Ok(9), "exactly full is fine");
    }

    #[test]
    fn an_empty_prompt_is_not_a_context_length_error() {
        let e = check(0, 4, 10, 1000).unwrap_err();
        assert_eq!((e.param.as_deref(), e.code), (Some("prompt"), None));
        assert_eq!(check(20, 4, 10, 1000).unwrap_err().code, Some("context_length_exceeded"));
    }

    #[test]
    fn the_end_tokens_join_the_stop_ids_once_unless_ignored() {
        let info = info(100);
        let bounds = Bounds { info: &info, kv_capacity: None, max_prompt: 99, eos: &[2, 3] };
        let params = GenerateParams { stop_token_ids: vec![7, 2], ..GenerateParams::default() };
        let valid = unchecked(vec![vec![1]], params.clone(), 2, None).check(&bounds, "prompt", 0);
        assert_eq!(valid.unwrap().params().stop_token_ids, vec![2, 3, 7]);
        let ignoring = GenerateParams { ignore_eos: true, ..params };
        let valid = unchecked(vec![vec![1]], ignoring, 1, None).check(&bounds, "prompt", 0);
        assert_eq!(valid.unwrap().params().stop_token_ids, vec![2, 7]);
    }

    #[test]
    fn choices_differ_by_seed_and_only_the_first_continues_the_session() {
        let info = info(100);
        let bounds = Bounds { info: &info, kv_capacity: None, max_prompt: 99, eos: &[] };
        let mut params = GenerateParams::default();
        params.sampling.seed = Some(10);
        let session = Some("chat".to_string());
        let valid = unchecked(vec![vec![1], vec![4, 5]], params, 2, session).check(&bounds, "prompt", 0);
        let choices = valid.unwrap().choices();
        let seen: Vec<_> = choices.iter().map(|c| (c.prompt.len(), c.params.sampling.seed, c.session())).collect();
        assert_eq!(
            seen,
            vec![(1, Some(10), Some("chat")), (1, Some(11), None), (2, Some(10), None), (2, Some(11), None)]
        );
    }
}
