"""Image inputs for the Qwen2-VL, Qwen2.5-VL and Qwen3-VL fixtures (after `make_family_fixtures.py qwen2vl`
and `... qwen3vl` wrote them).

Makes each fixture a model that sees: its tiny vision tower's weights drawn at a scale where an
image moves the logits (transformers' initialization leaves them near zero), its config's image
token ids those of its tokenizer (<|image_pad|> 968, <|vision_start|> 965, <|vision_end|> 966, as
in Qwen's vocabulary), Qwen2-VL-Instruct's chat template (which Qwen2.5-VL-Instruct ships too;
images as <|vision_start|><|image_pad|><|vision_end|>) and a preprocessor_config.json
(Qwen2VLImageProcessor; max_pixels small enough that a larger image is scaled down). The language
model is untouched: the text references still hold (checked here).
- `qwen2vl`: tests/fixtures/tiny-qwen2vl-f32, as transformers' save_pretrained writes it (the
  template in chat_template.jinja);
- `qwen25vl`: tests/fixtures/tiny-qwen25vl-f32, as Qwen's released checkpoints are (the tower
  under visual., the template in chat_template.json), its tower's first block attending within
  windows and its second over the whole image;
- `qwen3vl`: tests/fixtures/tiny-qwen3vl-f32, as Qwen's released checkpoints are (the tower under
  model.visual., the template in chat_template.json), its tower's first two blocks giving deepstack
  features, its learned position table interpolated to each image's grid;
- `qwen3vlmoe` (after `qwen3vl`): tests/fixtures/tiny-qwen3vlmoe-f32, the same tower beside the MoE
  language model.

Writes the fixture's images/*.png and image_reference.json, what transformers' own processor and
model give for chats with those images:
- per image: its file, the processor's grid (t, h, w) and the first pixel values and their sum
  (the preprocessing), and the vision tower's merged features (the encoder; Qwen3-VL's deepstack
  features too);
- per prompt: the messages, the rendered text, the ids with each image's placeholder expanded,
  the last position's logits, the greedy continuation (transformers' generate, which turns the
  generated tokens by M-RoPE's position delta) and the smallest top-2 margin along it.

- `gemma3`: tests/fixtures/tiny-gemma3vl-f32, a random Gemma3ForConditionalGeneration as Google's released
  checkpoints are (a nested config, the tower under model.vision_tower., the projector under
  model.multi_modal_projector.): tiny-gemma3-f32's language model shape and tokenizer, the vocabulary
  grown by <start_of_image>, <end_of_image> and <image_soft_token> (1024, 1025, 1026), a SigLIP tower
  of two blocks over 128x128 images of 8-pixel patches (16x16), pooled 4x4 into 16 tokens an image;
  the language model's sliding window (16) as long as an image's tokens, so that a local layer's
  image rows see only the image.

Usage: python scripts/make_image_fixtures.py qwen2vl|qwen25vl|qwen3vl|qwen3vlmoe|qwen35|gemma3  (torch, transformers 5.x, torchvision, pillow)
"""

import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (AutoProcessor, Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration,
                          Qwen3VLForConditionalGeneration)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
# The tokenizer's own (as in Qwen's vocabulary).
IDS = {"image_token_id": 968, "video_token_id": 969, "vision_start_token_id": 965, "vision_end_token_id": 966}

# Qwen2-VL-7B-Instruct's chat template.
TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL-Instruct's way with images (its template has no default system prompt).
QWEN3VL_TEMPLATE = TEMPLATE.replace(
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}", "")
assert QWEN3VL_TEMPLATE != TEMPLATE

# Qwen3-VL's processor (size in transformers 5's names), its bounds small: 4 to 16 tokens an image.
QWEN3VL_PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
    "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 16},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
}

# The images and chats of the 16-pixel towers' fixtures: 64x64, the position table's own 4x4 grid (4
# tokens); 100x60: 96x64 (6 tokens); 150x130: past the bound, 128x96 (12 tokens); "other": another
# picture of square's size.
QWEN3_IMAGES = ([("square", 64, 64), ("wide", 100, 60), ("large", 150, 130), ("other", 64, 64)],
                [["square"], ["wide"], ["square", "large"], ["other"]])

PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
    "resample": 3, "rescale_factor": 1 / 255,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16,
    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
}


def image(width, height, seed):
    """A smooth picture with some noise, as RGB PNG bytes' source."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([127 + 120 * np.sin(x / (5 + 3 * c) + y / (7 + c) + c) for c in range(3)], -1)
    pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def randomize(visual, seed):
    """The tower's weights at a scale where an image moves the logits, drawn from `seed` alone (the
    same whatever the checkpoint held before, so that running this again writes the same files)."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda p: torch.randn(p.shape, generator=g, dtype=p.dtype)
    with torch.no_grad():
        for name, p in visual.named_parameters():
            if name.endswith("bias"):
                p.copy_(draw(p) * 0.1)
            elif p.dim() == 1:  # norm scales
                p.copy_(1 + draw(p) * 0.1)
            else:
                fan_in = p[0].numel()
                p.copy_(draw(p) / fan_in**0.5)


def write_tower(fixture, tower):
    """The fixture's model.safetensors with `tower`'s tensors (named as the checkpoint names them) in
    place of the vision tower it had."""
    path = os.path.join(fixture, "model.safetensors")
    prefix = next(iter(tower)).split("visual.")[0] + "visual."
    tensors = {k: v for k, v in load_file(path).items() if not k.startswith(prefix)}
    tensors.update({k: v.contiguous() for k, v in tower.items()})
    save_file(tensors, path, metadata={"format": "pt"})


def check_text(model, fixture):
    ref = json.load(open(os.path.join(fixture, "reference.json")))
    for p in ref["prompts"]:
        logits = model(torch.tensor([p["ids"]])).logits[0, -1]
        err = (logits - torch.tensor(p["last_logits"])).abs().max().item()
        assert err < 1e-4, f"the text logits moved by {err}"


def qwen2vl():
    """tiny-qwen2vl-f32, as transformers' save_pretrained writes it."""
    fixture = os.path.join(FIXTURES, "tiny-qwen2vl-f32")
    model = Qwen2VLForConditionalGeneration.from_pretrained(fixture, attn_implementation="eager").eval()
    randomize(model.model.visual, 7)
    for k, v in IDS.items():
        setattr(model.config, k, v)
    model.save_pretrained(fixture)
    tok_cfg_path = os.path.join(fixture, "tokenizer_config.json")
    tok_cfg = json.load(open(tok_cfg_path, encoding="utf-8"))
    tok_cfg.pop("chat_template", None)
    json.dump(tok_cfg, open(tok_cfg_path, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    open(os.path.join(fixture, "chat_template.jinja"), "w").write(TEMPLATE)
    json.dump(PREPROCESSOR, open(os.path.join(fixture, "preprocessor_config.json"), "w"), indent=2)
    model = Qwen2VLForConditionalGeneration.from_pretrained(fixture, attn_implementation="eager").eval()
    check_text(model, fixture)
    # 56x56: no resize (a 4x4 grid, 4 tokens); 100x60: resized to 112x56 (8 tokens); 150x130:
    # past max_pixels, scaled down to 84x112 (12 tokens); "other": another picture of square's
    # size (the same tokens, other features: a cached prefix must not be taken for it).
    shapes = [("square", 56, 56), ("wide", 100, 60), ("large", 150, 130), ("other", 56, 56)]
    chats = [["square"], ["wide"], ["square", "large"], ["other"]]
    references(model, fixture, shapes, chats)


def qwen25vl():
    """tiny-qwen25vl-f32, laid out as Qwen's released Qwen2.5-VL checkpoints are (a flat config.json,
    the tower under visual., the chat template in chat_template.json): a tower of two blocks, the
    first attending within windows of 4x4 merged tokens (window_size 112), the second over the whole
    image (fullatt_block_indexes), as the released towers alternate them."""
    fixture = os.path.join(FIXTURES, "tiny-qwen25vl-f32")
    cfg_path = os.path.join(fixture, "config.json")
    cfg = json.load(open(cfg_path))
    cfg.update(IDS)
    cfg["vision_config"].update(depth=2, fullatt_block_indexes=[1], window_size=112, hidden_act="silu")
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    json.dump({"chat_template": TEMPLATE}, open(os.path.join(fixture, "chat_template.json"), "w"))
    json.dump(dict(PREPROCESSOR, processor_class="Qwen2_5_VLProcessor", max_pixels=28 * 28 * 64),
              open(os.path.join(fixture, "preprocessor_config.json"), "w"), indent=2)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(fixture, attn_implementation="eager").eval()
    randomize(model.model.visual, 8)
    write_tower(fixture, {"visual." + k: v for k, v in model.model.visual.state_dict().items()})
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(fixture, attn_implementation="eager").eval()
    check_text(model, fixture)
    # 56x56: one window; 150x130: 140x140, a 5x5 grid of merged tokens in four windows (4x4, 4x1,
    # 1x4, 1x1); 300x260: past max_pixels, 224x196 (8x7 merged tokens, four windows).
    shapes = [("square", 56, 56), ("large", 150, 130), ("huge", 300, 260), ("other", 56, 56)]
    chats = [["square"], ["large"], ["square", "huge"], ["other"]]
    references(model, fixture, shapes, chats)


def qwen3vl():
    """tiny-qwen3vl-f32, as Qwen's released Qwen3-VL checkpoints are (a nested config, the tower under
    model.visual., the template in chat_template.json): a tower of three blocks whose first two give
    deepstack features (added to the language model's first two layers' outputs at the image's rows),
    its learned position table 4x4 (interpolated to each image's grid), 16-pixel patches."""
    fixture = os.path.join(FIXTURES, "tiny-qwen3vl-f32")
    cfg_path = os.path.join(fixture, "config.json")
    cfg = json.load(open(cfg_path))
    cfg.update(IDS)
    cfg["vision_config"] = {"depth": 3, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                            "out_hidden_size": cfg["text_config"]["hidden_size"], "patch_size": 16,
                            "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
                            "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 1],
                            "hidden_act": "gelu_pytorch_tanh"}
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    json.dump({"chat_template": QWEN3VL_TEMPLATE}, open(os.path.join(fixture, "chat_template.json"), "w"))
    json.dump(QWEN3VL_PREPROCESSOR, open(os.path.join(fixture, "preprocessor_config.json"), "w"), indent=2)
    model = Qwen3VLForConditionalGeneration.from_pretrained(fixture, attn_implementation="eager").eval()
    randomize(model.model.visual, 9)
    write_tower(fixture, {"model.visual." + k: v for k, v in model.model.visual.state_dict().items()})
    model = Qwen3VLForConditionalGeneration.from_pretrained(fixture, attn_implementation="eager").eval()
    check_text(model, fixture)
    references(model, fixture, *QWEN3_IMAGES)


def qwen3vlmoe():
    """tiny-qwen3vlmoe-f32 (after `qwen3vl`): tiny-qwen3vl-f32's tower, processor and template beside its
    MoE language model, and the same images' references through it (transformers' Qwen3-VL-MoE class,
    loaded as make_family_fixtures.py's as_qwen3vl loads it)."""
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration
    dense, fixture = os.path.join(FIXTURES, "tiny-qwen3vl-f32"), os.path.join(FIXTURES, "tiny-qwen3vlmoe-f32")
    cfg_path = os.path.join(fixture, "config.json")
    cfg = json.load(open(cfg_path))
    cfg.update(IDS)
    cfg["vision_config"] = json.load(open(os.path.join(dense, "config.json")))["vision_config"]
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    for name in ("chat_template.json", "preprocessor_config.json"):
        shutil.copy(os.path.join(dense, name), fixture)
    write_tower(fixture, {k: v for k, v in load_file(os.path.join(dense, "model.safetensors")).items()
                          if k.startswith("model.visual.")})
    path = os.path.join(fixture, "model.safetensors")
    model = Qwen3VLMoeForConditionalGeneration(Qwen3VLMoeConfig.from_pretrained(fixture)).eval()
    fused = ("experts.gate_up_proj", "experts.down_proj")
    state = {k: v.transpose(1, 2) if k.endswith(fused) else v for k, v in load_file(path).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    if cfg["text_config"]["tie_word_embeddings"] or cfg.get("tie_word_embeddings"):
        model.tie_weights()
    check_text(model, fixture)
    references(model, fixture, *QWEN3_IMAGES)


def qwen35():
    """tiny-qwen35-f32 and tiny-qwen35moe-f32, as Qwen's released Qwen3.5 checkpoints are (a nested config,
    the tower under model.visual., Qwen3.5's own template in tokenizer_config.json): Qwen3-VL's tower
    without the deepstack, two blocks, its position table 4x4, 16-pixel patches."""
    import transformers
    for name, cls in (("tiny-qwen35-f32", "Qwen3_5ForConditionalGeneration"),
                      ("tiny-qwen35moe-f32", "Qwen3_5MoeForConditionalGeneration")):
        cls = getattr(transformers, cls)
        fixture = os.path.join(FIXTURES, name)
        cfg_path = os.path.join(fixture, "config.json")
        cfg = json.load(open(cfg_path))
        cfg.update(IDS)
        cfg["vision_config"] = {"model_type": cfg["model_type"], "depth": 2, "hidden_size": 16, "intermediate_size": 32,
                                "num_heads": 2, "out_hidden_size": cfg["text_config"]["hidden_size"], "patch_size": 16,
                                "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
                                "num_position_embeddings": 16, "hidden_act": "gelu_pytorch_tanh"}
        json.dump(cfg, open(cfg_path, "w"), indent=2)
        json.dump(QWEN3VL_PREPROCESSOR, open(os.path.join(fixture, "preprocessor_config.json"), "w"), indent=2)
        # The stub tower make_family_fixtures.py wrote is another shape.
        model = cls.from_pretrained(fixture, attn_implementation="eager", ignore_mismatched_sizes=True).eval()
        randomize(model.model.visual, 10)
        write_tower(fixture, {"model.visual." + k: v for k, v in model.model.visual.state_dict().items()})
        model = cls.from_pretrained(fixture, attn_implementation="eager").eval()
        check_text(model, fixture)
        references(model, fixture, *QWEN3_IMAGES)


def gemma3():
    """tiny-gemma3vl-f32 (the module's doc)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    text_fixture, fixture = os.path.join(FIXTURES, "tiny-gemma3-f32"), os.path.join(FIXTURES, "tiny-gemma3vl-f32")
    os.makedirs(fixture, exist_ok=True)
    text = json.load(open(os.path.join(text_fixture, "config.json")))
    for k in ("architectures", "dtype", "transformers_version", "use_cache"):
        text.pop(k, None)
    text["vocab_size"] = 1027
    vision = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
              "num_attention_heads": 2, "num_hidden_layers": 2, "image_size": 128, "patch_size": 8,
              "num_channels": 3, "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh",
              "vision_use_head": False}
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=16,
                          boi_token_index=1024, eoi_token_index=1025, image_token_index=1026,
                          bos_token_id=2, eos_token_id=[1, 5], pad_token_id=0)
    torch.manual_seed(11)
    model = Gemma3ForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(15)
    with torch.no_grad():
        # The language model at a scale where the logits differ token to token.
        for name, p in model.model.language_model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        randomize(model.model.vision_tower, 13)
        proj = model.model.multi_modal_projector
        proj.mm_input_projection_weight.copy_(torch.randn(proj.mm_input_projection_weight.shape, generator=g)
                                              / proj.mm_input_projection_weight.shape[0] ** 0.5)
        proj.mm_soft_emb_norm.weight.copy_(torch.randn(proj.mm_soft_emb_norm.weight.shape, generator=g) * 0.1)
    model.save_pretrained(fixture)
    # The tower under vision_tower.vision_model., as Google's checkpoints (and llama.cpp's converter)
    # have it; transformers 5 saves it without vision_model. and reads either.
    path = os.path.join(fixture, "model.safetensors")
    tensors = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
               for k, v in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})
    tok = json.load(open(os.path.join(text_fixture, "tokenizer.json"), encoding="utf-8"))
    for i, content in ((1024, "<start_of_image>"), (1025, "<end_of_image>"), (1026, "<image_soft_token>")):
        tok["added_tokens"].append({"id": i, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    json.dump(tok, open(os.path.join(fixture, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    tok_cfg = json.load(open(os.path.join(text_fixture, "tokenizer_config.json"), encoding="utf-8"))
    tok_cfg.update(boi_token="<start_of_image>", eoi_token="<end_of_image>", image_token="<image_soft_token>",
                   extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                         "image_token": "<image_soft_token>"},
                   processor_class="Gemma3Processor",
                   # Where llama.cpp's converter finds tokens tokenizer.model lacks.
                   added_tokens_decoder={str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                           "single_word", "special")}
                                         for t in tok["added_tokens"]})
    json.dump(tok_cfg, open(os.path.join(fixture, "tokenizer_config.json"), "w", encoding="utf-8"),
              ensure_ascii=False, indent=1)
    # tokenizer.model: what llama.cpp's converter reads Gemma's vocabulary from.
    for name in ("generation_config.json", "tokenizer.model"):
        shutil.copy(os.path.join(text_fixture, name), fixture)
    json.dump({"image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
               "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": None,
               "do_pan_and_scan": None, "resample": 2, "rescale_factor": 1 / 255,
               "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "image_seq_length": 16,
               "size": {"height": 128, "width": 128}},
              open(os.path.join(fixture, "preprocessor_config.json"), "w"), indent=2)
    json.dump({"processor_class": "Gemma3Processor", "image_seq_length": 16},
              open(os.path.join(fixture, "processor_config.json"), "w"), indent=2)
    model = Gemma3ForConditionalGeneration.from_pretrained(fixture, attn_implementation="eager").eval()
    # 128x128: no resize; 100x60: stretched up to 128x128; 300x260: shrunk (antialiased);
    # "other": another picture of square's size.
    shapes = [("square", 128, 128), ("wide", 100, 60), ("large", 300, 260), ("other", 128, 128)]
    chats = [["square"], ["wide"], ["square", "large"], ["other"]]
    references(model, fixture, shapes, chats)


def references(model, fixture, shapes, chats):
    """The images' files and image_reference.json (the module's doc)."""
    model = model.eval()
    processor = AutoProcessor.from_pretrained(fixture)
    os.makedirs(os.path.join(fixture, "images"), exist_ok=True)
    images = {}
    out = {"model": os.path.basename(fixture), "torch": torch.__version__, "images": [], "prompts": []}
    for k, (name, w, h) in enumerate(shapes):
        img = image(w, h, k)
        path = os.path.join("images", f"{name}.png")
        img.save(os.path.join(fixture, path))
        images[name] = Image.open(os.path.join(fixture, path)).convert("RGB")
        inputs = processor.image_processor(images=[images[name]], return_tensors="pt")
        pv = inputs["pixel_values"]
        # Gemma 3's images are of one size, their patches a square grid.
        grid = inputs.get("image_grid_thw")
        with torch.no_grad():
            output = model.model.get_image_features(pv, grid) if grid is not None else model.model.get_image_features(pv)
        first = pv[0, :16] if grid is not None else None
        if grid is None:
            patch = model.config.vision_config.patch_size
            side = model.config.vision_config.image_size // patch
            grid = torch.tensor([[1, side, side]])
            # The first patch's values (its first channel's rows), as the tower takes patches.
            first = pv[0, :, :patch, :patch].flatten()[:16]
        flat = lambda f: torch.cat(list(f), 0) if isinstance(f, (list, tuple)) else f
        feats = flat(output.pooler_output if hasattr(output, "pooler_output") else output)
        feats = feats.reshape(-1, feats.shape[-1])  # Gemma 3's: [1, tokens, hidden]
        # Qwen3-VL's: features of the tower's earlier blocks, added to the language model's first layers.
        deepstack = [flat(f).tolist() for f in getattr(output, "deepstack_features", None) or []]
        out["images"].append({
            "file": path, "grid": grid[0].tolist(), "patches": list(pv.shape),
            "first_values": first.tolist(), "sum": pv.double().sum().item(),
            "abs_sum": pv.double().abs().sum().item(), "features": feats.tolist(),
            "deepstack": deepstack,
        })

    for names in chats:
        content = [{"type": "image"} for _ in names] + [{"type": "text", "text": "What is in the picture?"}]
        messages = [{"role": "user", "content": content}]
        # Qwen3.5's template is its tokenizer's (tokenizer_config.json), not the processor's.
        templated = processor if processor.chat_template else processor.tokenizer
        text = templated.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # A template that writes the BOS itself (Gemma's): not a second one from the tokenizer.
        bos = processor.tokenizer.bos_token
        extra = {"add_special_tokens": False} if bos and text.startswith(bos) else {}
        inputs = processor(text=[text], images=[images[n] for n in names], return_tensors="pt", **extra)
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1]
            gen = model.generate(**inputs, max_new_tokens=8, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True)
        greedy = gen.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        margins = [float(torch.topk(s[0], 2).values.diff().abs()) for s in gen.scores]
        out["prompts"].append({
            "images": names, "messages": messages, "text": text,
            "ids": inputs["input_ids"][0].tolist(), "last_logits": logits.tolist(),
            "greedy": greedy, "min_margin": min(margins),
        })
        print(names, len(inputs["input_ids"][0]), greedy, min(margins))
    json.dump(out, open(os.path.join(fixture, "image_reference.json"), "w"))


if __name__ == "__main__":
    {"qwen2vl": qwen2vl, "qwen25vl": qwen25vl, "qwen3vl": qwen3vl, "qwen3vlmoe": qwen3vlmoe, "qwen35": qwen35, "gemma3": gemma3}[sys.argv[1]]()
