//! T3: a chat's tools — checked against OpenAI's rules before anything is rendered or compiled,
//! then turned into the constraint and the parsing of the answer's tool calls.

use llaisys_model::tokenizer::ChatMessage;
use llaisys_model::{CallSyntax, GrammarCompiler, Guidance, HarmonyTags};

use super::params::GenerateParams;
use super::request::{Options, RequestError, Tool, ToolChoice};
use std::sync::Arc;

use crate::request::{TextCallSpec, TextCallTool, ToolParsing, XmlTools};

/// The request's tool choice against its tools and constraint, before anything is rendered or
/// compiled; whether the tools are offered to the model.
pub(super) fn check_tool_choice(options: &Options) -> Result<bool, RequestError> {
    let choice = options.tool_choice.clone().unwrap_or_default();
    if let ToolChoice::Function(name) = &choice
        && !options.tools.iter().any(|t| &t.name == name)
    {
        return Err(RequestError::invalid(
            "tool_choice",
            format!("tool_choice names {name:?}, which is not among the tools"),
        ));
    }
    if options.tools.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(false),
            _ => Err(RequestError::invalid("tool_choice", "tool_choice requires tools")),
        };
    }
    if choice != ToolChoice::None && options.constraint.is_some() {
        return Err(RequestError::invalid(
            "constraint",
            "a constraint cannot be combined with tools unless tool_choice is none",
        ));
    }
    Ok(choice != ToolChoice::None)
}

/// Tools as OpenAI allows them: names of 1–64 letters, digits, `_` and `-`, each once;
/// parameters a JSON schema object.
pub(super) fn check_tools(tools: &[Tool]) -> Result<(), RequestError> {
    for (i, tool) in tools.iter().enumerate() {
        let name_ok = (1..=64).contains(&tool.name.len())
            && tool.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(RequestError::invalid(
                format!("tools[{i}].function.name"),
                format!("{:?} is not a function name (1–64 of a-z, A-Z, 0-9, _ and -)", tool.name),
            ));
        }
        if tools[..i].iter().any(|t| t.name == tool.name) {
            return Err(RequestError::invalid(
                format!("tools[{i}].function.name"),
                format!("{:?} is offered twice", tool.name),
            ));
        }
        if !tool.parameters.is_object() {
            return Err(RequestError::invalid(
                format!("tools[{i}].function.parameters"),
                "the parameters are a JSON schema object",
            ));
        }
    }
    Ok(())
}

/// T3: the constraint and parsing of a chat's tool calls (`options.tools` not empty, checked by
/// `check_tool_choice`) in the model's `syntax`, with its grammar `compiler`; `messages` are the
/// conversation a call written as text must draw an argument from.
pub(super) fn constrain_calls(
    params: &mut GenerateParams,
    options: &Options,
    messages: &[ChatMessage],
    syntax: CallSyntax,
    compiler: &GrammarCompiler,
) -> Result<(), RequestError> {
    let choice = options.tool_choice.clone().unwrap_or_default();
    let token = |name: &str| {
        let missing = || RequestError::invalid("tools", format!("this model's vocabulary has no {name} tag"));
        compiler.special_token(name).ok_or_else(missing)
    };
    let tags = syntax.tags().map(|tags| tags.try_map(token)).transpose()?;
    let open = tags.map(|t| t.open);
    if choice == ToolChoice::None {
        // A constraint's grammar decides alone (it reaches the tag only by naming it). With no
        // tags there is nothing to forbid: the tools are not shown to the model.
        if options.constraint.is_none()
            && let Some(open) = open
        {
            params.guidance = Guidance::forbid(vec![open]);
        }
        return Ok(());
    }
    let functions = chosen(options, &choice);
    let named = matches!(choice, ToolChoice::Function(_));
    let parallel = options.parallel_tool_calls.unwrap_or(true) && !named;
    let with_open = choice != ToolChoice::Auto;
    let grammar = compiler
        .tool_calls(&functions, tags, syntax, with_open, parallel)
        .map_err(|e| RequestError::invalid("tools", e.0))?;
    let xml = matches!(syntax, CallSyntax::Xml | CallSyntax::ArgPairs).then(|| Arc::new(XmlTools::new(&functions)));
    params.tool_calls = Some(ToolParsing { tags, xml, finish_with_tool_calls: !named });
    let text_calls = |grounds| {
        let tools = functions.iter().map(|(name, parameters)| TextCallTool::new(name, parameters)).collect();
        Some(Arc::new(TextCallSpec { tools, grounds }))
    };
    params.guidance = match (with_open, open) {
        (true, _) => Guidance::grammar(grammar),
        (false, Some(open)) => Guidance::after(open, grammar),
        // Llama's calls have no tag to hold a grammar back until: `auto` is free.
        (false, None) => Guidance::default(),
    };
    if with_open && syntax == CallSyntax::Bare {
        // The grammar makes the answer one call, which is read from the text.
        params.text_calls = text_calls(None);
    }
    if choice == ToolChoice::Auto {
        // In `auto` the model may also write the call as text (a ```json fence, bare JSON, and
        // Llama's calls always): the output's `TextCalls` recognises one that is exactly a call
        // to an offered tool.
        params.text_calls = text_calls(Some(conversation_text(messages)));
        // A rejected call written as text is answered again, as text (it is held back, so the
        // client never saw it): small models write a made-up call for a greeting or a sum.
        params.text_retry =
            Some(Guidance::forbid(open.into_iter().collect()).not_opening_with(compiler.json_openers()));
    }
    Ok(())
}

/// T3 and the thinking budget of a harmony model's (gpt-oss's) chat with no constraint of its
/// own, its format's `tags` in the vocabulary: `auto` leaves calls to the model and reads those
/// it writes; `required` or a named choice makes the turn one call (after any reasoning), to the
/// tool named or any offered; a `thinking_budget` caps the analysis message's tokens, the turn
/// then held to the format (the final answer or a call). The compiler is built only where a
/// grammar is.
pub(super) fn constrain_harmony<E: From<RequestError>>(
    params: &mut GenerateParams,
    options: &Options,
    tags: HarmonyTags,
    compiler: impl FnOnce() -> Result<Arc<GrammarCompiler>, E>,
) -> Result<(), E> {
    let choice = options.tool_choice.clone().unwrap_or_default();
    let offered = !options.tools.is_empty() && choice != ToolChoice::None;
    let call = offered && choice != ToolChoice::Auto;
    if offered {
        let named = matches!(choice, ToolChoice::Function(_));
        params.tool_calls = Some(ToolParsing { tags: None, xml: None, finish_with_tool_calls: !named });
    }
    if call || options.thinking_budget.is_some() {
        let functions = if offered { chosen(options, &choice) } else { Vec::new() };
        let field = if offered { "tools" } else { "thinking_budget" };
        let grammar = compiler()?
            .harmony_turn(&functions, tags, call, options.thinking_budget)
            .map_err(|e| RequestError::invalid(field, e.0))?;
        params.guidance = Guidance::grammar(grammar);
    }
    Ok(())
}

/// The tools a call may go to: the one `choice` names, else all offered; each name with its
/// parameters' schema.
fn chosen<'a>(options: &'a Options, choice: &ToolChoice) -> Vec<(&'a str, &'a serde_json::Value)> {
    options
        .tools
        .iter()
        .filter(|t| match choice {
            ToolChoice::Function(name) => &t.name == name,
            _ => true,
        })
        .map(|t| (t.name.as_str(), &t.parameters))
        .collect()
}

/// The conversation's words, lowercased: every message's text and earlier calls' arguments.
fn conversation_text(messages: &[ChatMessage]) -> String {
    let mut text = String::new();
    for m in messages {
        text.push_str(&m.content.to_lowercase());
        text.push('\n');
        for call in &m.tool_calls {
            text.push_str(&call.arguments.to_lowercase());
            text.push('\n');
        }
    }
    text
}
