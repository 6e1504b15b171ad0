//! Images in chats against the real server: the tiny Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5
//! (dense and MoE) and Gemma 3 fixtures answer a chat with images sent as `data:` URLs with the
//! tokens transformers generates for the same chat (each fixture's image_reference.json), a
//! cached prefix is not taken for another image of the same size, and images are refused by name
//! where they cannot be taken.

use base64::Engine as _;
use llaisys_tests::{converted_fixture, fixture_dir};
use serde_json::{Value, json};

mod common;
use common::{get, post, server_for};

const FIXTURE: &str = "tiny-qwen2vl-f32";

fn reference(fixture: &str) -> Value {
    let path = fixture_dir(fixture).join("image_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Image `name` of the fixture as a data: URL.
fn data_url(fixture: &str, name: &str) -> String {
    let bytes = std::fs::read(fixture_dir(fixture).join(format!("images/{name}.png"))).unwrap();
    format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The reference prompt's chat in OpenAI's parts: its images, then its text.
fn chat(fixture: &str, prompt: &Value) -> Value {
    let mut parts: Vec<Value> = (prompt["images"].as_array().unwrap().iter())
        .map(|n| json!({"type": "image_url", "image_url": {"url": data_url(fixture, n.as_str().unwrap())}}))
        .collect();
    parts.push(json!({"type": "text", "text": "What is in the picture?"}));
    json!({"model": fixture, "messages": [{"role": "user", "content": parts}], "temperature": 0,
        "max_tokens": prompt["greedy"].as_array().unwrap().len(), "ignore_eos": true, "return_token_ids": true,
        "logprobs": true})
}

/// The log-probability transformers' last logits give the prompt's first greedy token.
fn first_logprob(prompt: &Value) -> f64 {
    let logits: Vec<f64> = prompt["last_logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
    logits[prompt["greedy"][0].as_u64().unwrap() as usize] - max - sum.ln()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_with_images_answers_as_transformers_does() {
    for fixture in [
        FIXTURE,
        "tiny-qwen25vl-f32",
        "tiny-qwen3vl-f32",
        "tiny-qwen3vlmoe-f32",
        "tiny-qwen35-f32",
        "tiny-qwen35moe-f32",
        "tiny-gemma3vl-f32",
    ] {
        chat_as_transformers(fixture, &[]).await;
    }
}

/// Gemma 3's image rows see each other both ways: in steps of 5 prompt tokens the prompt is cut
/// before each image of 16 rows, which is computed whole past the step's budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_seeing_itself_both_ways_is_never_cut_into_chunks() {
    chat_as_transformers("tiny-gemma3vl-f32", &[("engine.max_tokens_per_step", "5")]).await;
}

async fn chat_as_transformers(fixture: &str, settings: &[(&str, &str)]) {
    let s = server_for(&fixture_dir(fixture), settings).await;
    // "other" last: a picture of "square"'s size, whose tokens are the same ids but for the
    // image's; the cache holds "square"'s chat by then, which must not be taken for it.
    for prompt in reference(fixture)["prompts"].as_array().unwrap() {
        let (status, c) = post(&s, "/v1/chat/completions", chat(fixture, prompt)).await;
        assert_eq!(status, 200, "{c}");
        assert_eq!(c["choices"][0]["token_ids"], prompt["greedy"], "{:?}: {c}", prompt["images"]);
        let logprob = c["choices"][0]["logprobs"]["content"][0]["logprob"].as_f64().unwrap();
        // Within the server's 16-bit KV cache's rounding (an image's rows cut from each other
        // move Gemma 3's by 0.05).
        let expected = first_logprob(prompt);
        assert!((logprob - expected).abs() < 1e-2, "{fixture} {:?}: logprob {logprob}, {expected}", prompt["images"]);
        // The prompt as transformers' processor writes it: each image's placeholder repeated.
        assert_eq!(c["prompt_token_ids"], prompt["ids"], "{fixture} {:?}", prompt["images"]);
        assert_eq!(c["usage"]["prompt_tokens"], json!(prompt["ids"].as_array().unwrap().len()), "{c}");
    }
    // The same chat again reuses its cached prefix (the image's tokens included).
    let square = &reference(fixture)["prompts"][0];
    let (_, c) = post(&s, "/v1/chat/completions", chat(fixture, square)).await;
    assert_eq!(c["choices"][0]["token_ids"], square["greedy"], "{c}");
    let cached = c["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached + 1 >= square["ids"].as_array().unwrap().len() as u64 - 1, "{c}");
    // The template's rendering, counted as the prompt is.
    let tokenized = json!({"model": fixture, "messages": chat(fixture, square)["messages"]});
    let (status, t) = post(&s, "/tokenize", tokenized).await;
    assert_eq!((status, &t["count"]), (200, &json!(square["ids"].as_array().unwrap().len())), "{t}");
    s.shutdown().await;
}

/// A photo sent inline is megabytes of base64: the default body limit takes 48 MiB (here a chat
/// after 3 MiB of the JSON's leading whitespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_sized_body_is_taken_by_default() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let square = &reference(FIXTURE)["prompts"][0];
    let body = format!("{}{}", " ".repeat(3 << 20), chat(FIXTURE, square));
    let r = reqwest::Client::new()
        .post(common::url(&s, "/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_that_cannot_be_taken_are_refused_by_name() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let square = &reference(FIXTURE)["prompts"][0];
    let with_url = |url: &str| {
        let mut body = chat(FIXTURE, square);
        body["messages"][0]["content"][0]["image_url"]["url"] = url.into();
        body
    };
    for (url, says) in [
        ("ftp://example.com/cat.png", "http(s) URL"),
        ("data:image/png;base64,bm90IGFuIGltYWdl", "could not be decoded"),
        ("data:image/png;base64,@@@", "base64"),
    ] {
        let (status, e) = post(&s, "/v1/chat/completions", with_url(url)).await;
        assert_eq!(status, 400, "{e}");
        assert_eq!(e["error"]["param"], "messages[0].content[0].image_url", "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(says), "{url}: {e}");
    }
    // A placeholder written in the text is not an image.
    let mut body = chat(FIXTURE, square);
    body["messages"][0]["content"][1]["text"] = "<|vision_start|><|image_pad|><|vision_end|>".into();
    let (status, e) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("placeholders"), "{e}");
    // Prompt log-probabilities are not given for image tokens.
    let mut body = chat(FIXTURE, square);
    body["prompt_logprobs"] = 1.into();
    let (status, e) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!((status, &e["error"]["param"]), (400, &json!("prompt_logprobs")), "{e}");
    s.shutdown().await;
    // A text model says it takes text only.
    let text = server_for(&fixture_dir("tiny-qwen3-f32"), &[]).await;
    let mut body = chat(FIXTURE, square);
    body["model"] = "tiny-qwen3-f32".into();
    let (status, e) = post(&text, "/v1/chat/completions", body).await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("text only"), "{e}");
    text.shutdown().await;
}

/// Responses' `input_image`, Anthropic's `image` blocks and Ollama's `images` give the chat
/// completions answer for the same chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dialect_takes_images() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let square = &reference(FIXTURE)["prompts"][0];
    let url = data_url(FIXTURE, "square");
    let question = "What is in the picture?";
    let (_, c) = post(&s, "/v1/chat/completions", chat(FIXTURE, square)).await;
    let expected = c["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(!expected.is_empty(), "{c}");
    let input = json!([{"role": "user", "content": [{"type": "input_image", "image_url": url},
        {"type": "input_text", "text": question}]}]);
    let (status, r) = post(
        &s,
        "/v1/responses",
        json!({"model": FIXTURE, "input": input, "temperature": 0,
        "max_output_tokens": 8}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output"][0]["content"][0]["text"], json!(expected), "{r}");
    let data = url.strip_prefix("data:image/png;base64,").unwrap();
    let blocks = json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        {"type": "text", "text": question}]);
    let body = json!({"model": FIXTURE, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": blocks}]});
    let (status, a) = post(&s, "/v1/messages", body.clone()).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["content"][0]["text"], json!(expected), "{a}");
    let (status, n) = post(&s, "/v1/messages/count_tokens", body).await;
    assert_eq!((status, &n["input_tokens"]), (200, &json!(square["ids"].as_array().unwrap().len())), "{n}");
    let body = json!({"model": FIXTURE, "stream": false, "options": {"temperature": 0, "num_predict": 8},
        "messages": [{"role": "user", "content": question, "images": [data]}]});
    let (status, o) = post(&s, "/api/chat", body).await;
    assert_eq!(status, 200, "{o}");
    assert_eq!(o["message"]["content"], json!(expected), "{o}");
    // Ollama's generate puts them in the template's user message; a raw prompt takes none.
    let body = json!({"model": FIXTURE, "stream": false, "options": {"temperature": 0, "num_predict": 8},
        "prompt": question, "images": [data]});
    let (status, g) = post(&s, "/api/generate", body.clone()).await;
    assert_eq!((status, &g["response"]), (200, &json!(expected)), "{g}");
    let mut raw = body;
    raw["raw"] = true.into();
    let (status, e) = post(&s, "/api/generate", raw).await;
    assert_eq!(status, 400, "{e}");
    // Ollama's clients offer images where a model's capabilities say "vision".
    let (_, show) = post(&s, "/api/show", json!({"model": FIXTURE})).await;
    assert!(show["capabilities"].as_array().unwrap().contains(&json!("vision")), "{show}");
    let (_, props) = common::get(&s, "/props").await;
    assert_eq!(props["modalities"]["vision"], true, "{props}");
    s.shutdown().await;
}

/// `limits.max_image_pixels` scales a larger image down to fewer tokens before the model's own
/// bound would: 150×130 pixels, 12 tokens under the fixture's processor, are 28×56 (2 tokens)
/// within 3,136 pixels; a 56×56 image, at the bound, keeps its 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_pixel_bound_scales_larger_images_down() {
    let s = server_for(&fixture_dir(FIXTURE), &[("limits.max_image_pixels", "3136")]).await;
    let square = &reference(FIXTURE)["prompts"][0];
    let square_tokens = square["ids"].as_array().unwrap().len();
    let large = chat(FIXTURE, &json!({"images": ["large"], "greedy": [0, 0]}));
    let (status, c) = post(&s, "/v1/chat/completions", large).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], json!(square_tokens - 4 + 2), "{c}");
    let (status, c) = post(&s, "/v1/chat/completions", chat(FIXTURE, square)).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], json!(square_tokens), "{c}");
    assert_eq!(c["choices"][0]["token_ids"], square["greedy"], "{c}");
    s.shutdown().await;
}

/// The server of the fixture as llama.cpp's converter writes it: the language model, and its tower
/// as a projector file (`model.mmproj`, the command line's `--mmproj`).
async fn gguf_server(fixture: &str) -> llaisys_server::Server {
    let mmproj = fixture_dir("gguf").join("converted").join(format!("mmproj-{fixture}.gguf"));
    let mmproj = format!("{:?}", mmproj.display().to_string());
    server_for(&converted_fixture(fixture), &[("model.mmproj", &mmproj)]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_model_sees_images_through_its_projector_file() {
    // Qwen2.5-VL as llama.cpp's converter writes it.
    let fixture = "tiny-qwen25vl-f32";
    let s = gguf_server(fixture).await;
    let (_, models) = get(&s, "/v1/models").await;
    assert_eq!(models["data"][0]["input_modalities"], json!(["text", "image"]), "{models}");
    let prompts = reference(fixture)["prompts"].as_array().unwrap().clone();
    // "large" (150×130) is within both processors' bounds: the checkpoint's grid, transformers' answer.
    let large = prompts.iter().find(|p| p["images"] == json!(["large"])).unwrap();
    let (status, c) = post(&s, "/v1/chat/completions", chat(fixture, large)).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["choices"][0]["token_ids"], large["greedy"], "{c}");
    assert_eq!(c["prompt_token_ids"], large["ids"], "{c}");
    // "square" (56×56) is below llama.cpp's least image of 8 tokens (6,272 px): scaled up to 84×84 as
    // llama.cpp scales it, 9 tokens where the checkpoint's processor gives 4.
    let square = &prompts[0];
    let (status, c) = post(&s, "/v1/chat/completions", chat(fixture, square)).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], json!(square["ids"].as_array().unwrap().len() - 4 + 9), "{c}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_gemma3_sees_images_through_its_projector_file() {
    // Gemma 3 as llama.cpp's converter writes it: each image framed in the prompt by its start and
    // end tokens from the model file's vocabulary, as transformers' processor frames it.
    let fixture = "tiny-gemma3vl-f32";
    let s = gguf_server(fixture).await;
    for prompt in reference(fixture)["prompts"].as_array().unwrap() {
        let (status, c) = post(&s, "/v1/chat/completions", chat(fixture, prompt)).await;
        assert_eq!(status, 200, "{c}");
        assert_eq!(c["prompt_token_ids"], prompt["ids"], "{:?}: {c}", prompt["images"]);
        assert_eq!(c["choices"][0]["token_ids"], prompt["greedy"], "{:?}: {c}", prompt["images"]);
    }
    s.shutdown().await;
}

/// A web server of the fixture's "square" image on this machine: `/square.png`, `/moved` (a
/// redirect to it), `/huge.png` (past 32 MiB); anything else is 404.
async fn image_host() -> (String, tokio::task::JoinHandle<()>) {
    use axum::routing::get as route;
    let png = std::fs::read(fixture_dir(FIXTURE).join("images/square.png")).unwrap();
    let app = axum::Router::new()
        .route("/square.png", route(move || std::future::ready(([("content-type", "image/png")], png.clone()))))
        .route("/moved", route(|| async { axum::response::Redirect::temporary("/square.png") }))
        .route("/huge.png", route(|| async { vec![0u8; (32 << 20) + 1] }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (format!("http://127.0.0.1:{port}"), tokio::spawn(async move { axum::serve(listener, app).await.unwrap() }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_by_url_are_fetched_where_the_server_may_reach_them() {
    let (host, task) = image_host().await;
    let square = &reference(FIXTURE)["prompts"][0];
    let by_url = |path: &str| {
        let mut body = chat(FIXTURE, square);
        body["messages"][0]["content"][0]["image_url"]["url"] = format!("{host}{path}").into();
        body
    };
    let refused = |e: &Value, says: &str| {
        assert_eq!(e["error"]["param"], "messages[0].content[0].image_url", "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(says), "{says}: {e}");
    };
    // By default only public hosts: this machine is not one.
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let (status, e) = post(&s, "/v1/chat/completions", by_url("/square.png")).await;
    assert_eq!(status, 400, "{e}");
    refused(&e, "not a public address");
    s.shutdown().await;
    // Listed, it is fetched: the answer is the inline image's, transformers'.
    let s = server_for(&fixture_dir(FIXTURE), &[("server.image_url_hosts", r#"["127.0.0.1"]"#)]).await;
    for path in ["/square.png", "/moved"] {
        let (status, c) = post(&s, "/v1/chat/completions", by_url(path)).await;
        assert_eq!(status, 200, "{path}: {c}");
        assert_eq!(c["choices"][0]["token_ids"], square["greedy"], "{path}: {c}");
        assert_eq!(c["prompt_token_ids"], square["ids"], "{path}: {c}");
    }
    // Anthropic's url source is fetched the same way.
    let blocks = json!([{"type": "image", "source": {"type": "url", "url": format!("{host}/square.png")}},
        {"type": "text", "text": "What is in the picture?"}]);
    let body =
        json!({"model": FIXTURE, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": blocks}]});
    let (status, a) = post(&s, "/v1/messages", body).await;
    assert_eq!(status, 200, "{a}");
    for (path, status_says) in [("/missing.png", "HTTP 404"), ("/huge.png", "larger than 32 MiB")] {
        let (status, e) = post(&s, "/v1/chat/completions", by_url(path)).await;
        assert_eq!(status, 400, "{e}");
        refused(&e, status_says);
    }
    // Another host than those listed is not fetched from, nor is anything when fetching is off.
    let mut other = by_url("/square.png");
    other["messages"][0]["content"][0]["image_url"]["url"] = host.replace("127.0.0.1", "localhost").into();
    let (status, e) = post(&s, "/v1/chat/completions", other).await;
    assert_eq!(status, 400, "{e}");
    refused(&e, "image_url_hosts, which has no localhost");
    s.shutdown().await;
    let s = server_for(&fixture_dir(FIXTURE), &[("server.image_urls", r#""off""#)]).await;
    let (status, e) = post(&s, "/v1/chat/completions", by_url("/square.png")).await;
    assert_eq!(status, 400, "{e}");
    refused(&e, "not fetched by this server");
    s.shutdown().await;
    task.abort();
}
