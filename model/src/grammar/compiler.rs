//! One parser factory per model (its token trie and lexer slices are built once, ~1 s for a
//! 152k vocabulary) compiles each request's constraint into a [`Grammar`].

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::TokEnv;
use llguidance::{ParserFactory, TokenParser};
use serde_json::{Value, json};

use super::calls::{
    CallSyntax, HarmonyTags, ToolCallTags, bare_call_grammar, call_array_grammar, calls_grammar, harmony_grammar,
    named_calls_grammar,
};
use super::env::VocabEnv;
use super::guide::{Guidance, GuidanceSpec};
use super::{Constraint, GrammarError, regex_escape};
use crate::Tokenizer;

/// Whitespace a JSON grammar allows between two of its tokens: one space, or a newline and
/// some indentation (as llama.cpp's JSON grammars). Bounded, so that an output cannot run
/// away in spaces; free enough for compact and pretty-printed JSON alike.
const JSON_WHITESPACE: &str = r"\x20|\n[\x20\x09]{0,20}";

/// The model's grammar compiler.
pub struct GrammarCompiler {
    factory: ParserFactory,
    /// The tokens that are whitespace only (each grammar carries them: `Grammar::whitespace`).
    whitespace: Arc<[u32]>,
    /// The tokens an answer written as JSON or in a code fence begins with, and the ends of a
    /// sequence (`json_openers`).
    openers: Arc<[u32]>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").field("vocab", &self.factory.tok_env().tok_trie().vocab_size()).finish()
    }
}

impl GrammarCompiler {
    /// `width`: the logits' width (the vocabulary is padded to it); `eos`: the tokens that end
    /// a sequence, the only ones a completed grammar allows.
    pub fn new(tokenizer: &Tokenizer, width: usize, eos: &[u32]) -> Result<Self, GrammarError> {
        let env: TokEnv = Arc::new(VocabEnv::new(tokenizer.clone(), width, eos)?);
        let trie = env.tok_trie();
        let blank = |b: &u8| b" \t\n\r".contains(b);
        let whitespace: Arc<[u32]> = (0..trie.vocab_size() as u32)
            .filter(|&t| {
                let bytes = trie.token(t);
                !bytes.is_empty() && bytes.iter().all(blank)
            })
            .collect();
        let json = (0..trie.vocab_size() as u32).filter(|&t| {
            let bytes = trie.token(t);
            !trie.is_special_token(t) && bytes.iter().find(|b| !blank(b)).is_some_and(|b| b"{[`".contains(b))
        });
        let mut openers: Vec<u32> = json.chain(whitespace.iter().copied()).chain(eos.iter().copied()).collect();
        openers.sort_unstable();
        openers.dedup();
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError(e.to_string()))?;
        factory.quiet();
        Ok(Self { factory, whitespace, openers: openers.into() })
    }

    /// Compiles `constraint`; a schema or grammar that does not compile is an error naming
    /// what is wrong (for a strict schema: the keywords it cannot enforce).
    pub fn compile(&self, constraint: &Constraint) -> Result<Grammar, GrammarError> {
        let top = match constraint {
            Constraint::JsonSchema { schema, strict } => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError(format!("a JSON schema is an object or a boolean, not {schema}")));
                }
                TopLevelGrammar::from_json_schema(with_json_options(schema.clone(), *strict))
            }
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(with_json_options(json!({"type": "object"}), false))
            }
            Constraint::Regex { pattern } => TopLevelGrammar::from_regex(pattern),
            Constraint::Choice { choices } => {
                if choices.is_empty() {
                    return Err(GrammarError("a choice needs at least one string".into()));
                }
                let alternatives: Vec<String> = choices.iter().map(|c| format!("(?:{})", regex_escape(c))).collect();
                TopLevelGrammar::from_regex(&alternatives.join("|"))
            }
            Constraint::Lark { grammar } => TopLevelGrammar::from_lark(grammar.clone()),
        };
        self.compile_top(top)
    }

    /// Compiles a Lark grammar the engine wrote itself (tool calls).
    pub fn compile_lark(&self, grammar: String) -> Result<Grammar, GrammarError> {
        self.compile_top(TopLevelGrammar::from_lark(grammar))
    }

    fn compile_top(&self, top: TopLevelGrammar) -> Result<Grammar, GrammarError> {
        let source = Arc::new(top.clone());
        let mut parser = self.factory.create_parser(top).map_err(|e| GrammarError(e.to_string().trim().into()))?;
        let warnings = parser.grammar_warnings();
        Ok(Grammar { parser: Arc::new(parser), warnings, source, whitespace: self.whitespace.clone() })
    }

    /// Compiles a constraint that crossed the network (`Guidance::spec` on another node).
    pub fn guidance(&self, spec: &GuidanceSpec) -> Result<Guidance, GrammarError> {
        let grammar = match &spec.grammar {
            Some(json) => {
                let top: TopLevelGrammar = serde_json::from_value(json.clone())
                    .map_err(|e| GrammarError(format!("a grammar from another node does not parse: {e}")))?;
                Some(self.compile_top(top)?)
            }
            None => None,
        };
        Ok(Guidance::from_parts(grammar, spec))
    }

    /// T3: tool calls to `functions` (each name with its parameters' schema) between the
    /// model's tags, in the syntax its template writes them (`CallSyntax`): Qwen2's
    /// `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`, or Qwen3.5's
    /// `<tool_call>\n<function=N>\n<parameter=P>\nV\n</parameter>\n</function>\n</tool_call>`;
    /// or Llama 3.x's answer that is one call, `{"name": N, "parameters": A}`, with no tags; or
    /// Mistral's after `[TOOL_CALLS]`, an array or each call's name and `[ARGS]`; or GLM's
    /// `<tool_call>N\n<arg_key>P</arg_key>\n<arg_value>V</arg_value>\n</tool_call>`.
    /// `with_open`: the grammar starts with the opening tag (a required or named call);
    /// otherwise just after it (the model opened a call by itself). `parallel`: more calls may
    /// follow, each on its own line (not in Llama's, which makes one call at a time).
    pub fn tool_calls(
        &self,
        functions: &[(&str, &Value)],
        tags: Option<ToolCallTags>,
        syntax: CallSyntax,
        with_open: bool,
        parallel: bool,
    ) -> Result<Grammar, GrammarError> {
        if syntax == CallSyntax::Bare {
            return self.compile_lark(bare_call_grammar(functions));
        }
        let missing =
            || GrammarError(format!("this model's vocabulary has no {} tag", syntax.tags().map_or("", |t| t.open)));
        let tags = tags.ok_or_else(missing)?;
        let (open, close) = (tags.open, tags.close);
        let first = if with_open { format!("<[{open}]> ") } else { String::new() };
        match syntax {
            CallSyntax::JsonArray | CallSyntax::TaggedList => {
                return self.compile_lark(call_array_grammar(functions, &first, parallel));
            }
            CallSyntax::Named { .. } => {
                return self.compile_lark(named_calls_grammar(functions, tags, &first, parallel));
            }
            _ => {}
        }
        let close = close.ok_or_else(missing)?;
        let more = if parallel { format!(" (\"\\n\" <[{open}]> call)*") } else { String::new() };
        self.compile_lark(calls_grammar(functions, syntax, &first, &more, close, tags.pairs))
    }

    /// T3: a turn in OpenAI's harmony format (gpt-oss) whose analysis takes at most `budget`
    /// tokens: one call to one of `functions` (each name with its parameters' schema) where `call`
    /// (a required or named `tool_choice`), else the final answer or such a call, after at most
    /// one analysis message. The arguments are JSON as an answer's (`response_format`): compact
    /// or spaced, as the model writes it.
    pub fn harmony_turn(
        &self,
        functions: &[(&str, &Value)],
        tags: HarmonyTags,
        call: bool,
        budget: Option<usize>,
    ) -> Result<Grammar, GrammarError> {
        let functions: Vec<(&str, Value)> = functions
            .iter()
            .map(|(name, parameters)| (*name, with_json_options((*parameters).clone(), false)))
            .collect();
        self.compile_lark(harmony_grammar(&functions, tags, call, budget))
    }

    /// The tokens an answer may not begin with when it must not be a call written as text
    /// (`Guidance::not_opening_with`): those that open a JSON object or array or a code fence
    /// (after any whitespace), whitespace alone (so that one does not come a token later),
    /// and the ends of a sequence (an empty answer).
    pub fn json_openers(&self) -> Arc<[u32]> {
        self.openers.clone()
    }

    /// The id of special token `name` (`<tool_call>`), if the vocabulary has it.
    pub fn special_token(&self, name: &str) -> Option<u32> {
        self.factory.tok_env().tok_trie().get_special_token(name)
    }
}

/// JSON options through llguidance's `x-guidance` key: bounded whitespace; lenient unless strict.
fn with_json_options(schema: Value, strict: bool) -> Value {
    let options = json!({
        "whitespace_pattern": JSON_WHITESPACE,
        "item_separator": ",",
        "key_separator": ":",
        "lenient": !strict,
    });
    match schema {
        Value::Object(mut map) => {
            map.insert("x-guidance".into(), options);
            Value::Object(map)
        }
        // `true` accepts any JSON value, `false` none.
        Value::Bool(true) => json!({"x-guidance": options}),
        other => other,
    }
}

/// A compiled constraint, cheap to clone; every sequence starts its own matcher from it.
#[derive(Clone)]
pub struct Grammar {
    parser: Arc<TokenParser>,
    warnings: Vec<String>,
    /// What it was compiled from: the form another node compiles it again from.
    source: Arc<TopLevelGrammar>,
    /// The vocabulary's whitespace-only tokens.
    whitespace: Arc<[u32]>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("warnings", &self.warnings).finish()
    }
}

impl PartialEq for Grammar {
    /// The same compilation (grammars are not compared by content).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.parser, &other.parser)
    }
}

impl Grammar {
    /// Schema features a lenient compile ignored.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The grammar before compilation, as JSON (llguidance's serialized form).
    pub(super) fn source(&self) -> serde_json::Value {
        serde_json::to_value(&*self.source).unwrap_or_default()
    }

    /// The vocabulary's whitespace-only tokens (what a reasoning model writes between its
    /// thinking and the answer a grammar constrains).
    pub(super) fn whitespace(&self) -> Arc<[u32]> {
        self.whitespace.clone()
    }

    pub(super) fn matcher(&self) -> llguidance::Matcher {
        llguidance::Matcher::new(Ok(self.parser.deep_clone()))
    }
}
