"""Real architectures with random weights (nothing is downloaded), for the parity suite in
``test_real_models.py``: Hugging Face ``transformers`` models from tiny configs, and
``torchvision`` and ``timm`` image classifiers, small ones as they are and big ones from tiny
configs. Each library's architectures are in ``ARCHS`` where it imports (torchvision and timm
need a torchvision built for the installed torch: none is installed beside torch 2.13.0 here);
``UNAVAILABLE`` says why a library's are not.

Each entry of ``ARCHS`` builds a fresh model and the keyword inputs of one training batch,
labels included, so the model computes its own loss inside the region, as users run it (an
image classifier through ``Classifier``, which adds the cross-entropy a training loop computes).
Every model has its dropouts (and layer drop, drop path, stochastic depth, SpecAugment masking)
off, so a run is deterministic and two deep copies of one model take exactly the same path.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F


def _import(name: str) -> Tuple[Optional[object], Optional[str]]:
    """``(module, None)``, or ``(None, why it does not import)``. Any error counts: a torchvision
    built for another torch fails with a RuntimeError (its operators do not register)."""
    try:
        return importlib.import_module(name), None
    except Exception as e:  # noqa: BLE001
        return None, f"{name} does not import: {type(e).__name__}: {e}"


tf, _TF_WHY = _import("transformers")
BATCH, SEQ, VOCAB, LABELS = 2, 8, 64, 3


@dataclass(frozen=True)
class Arch:
    """One architecture: ``build()`` returns a fresh model, ``inputs(g)`` its keyword inputs;
    ``library`` is where it comes from."""

    build: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.Generator], Dict[str, torch.Tensor]]
    library: str = "transformers"


def _tokens(g: torch.Generator, low: int = 3) -> torch.Tensor:
    # Token ids from `low` up: the ids below are the configs' special tokens (pad, bos, eos).
    return torch.randint(low, VOCAB, (BATCH, SEQ), generator=g)


def _text(g: torch.Generator) -> Dict[str, torch.Tensor]:
    """A causal LM batch: the model shifts the labels itself."""
    ids = _tokens(g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _classify_text(g: torch.Generator) -> Dict[str, torch.Tensor]:
    # The second sequence has two padding positions: the attention mask has work to do.
    ids = _tokens(g)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 2])}


def _seq2seq(g: torch.Generator) -> Dict[str, torch.Tensor]:
    """Source and target ids: the model builds the decoder's inputs by shifting the labels."""
    return {"input_ids": _tokens(g), "labels": _tokens(g)}


def _image(g: torch.Generator, size: int) -> Dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(BATCH, 3, size, size, generator=g), "labels": torch.tensor([1, 2])}


def _audio(g: torch.Generator) -> Dict[str, torch.Tensor]:
    # 128 samples give 14 frames through the feature encoder below; CTC targets of 4 tokens.
    return {
        "input_values": torch.randn(BATCH, 128, generator=g),
        "labels": torch.randint(1, 16, (BATCH, 4), generator=g),
    }


def _mel(g: torch.Generator) -> Dict[str, torch.Tensor]:
    # Whisper's encoder takes 2 * max_source_positions mel frames.
    return {"input_features": torch.randn(BATCH, 8, 16, generator=g), "labels": _tokens(g)}


def _model(cls, config) -> Callable[[], torch.nn.Module]:
    def build():
        torch.manual_seed(0)
        return cls(config)

    return build


def _gpt2(attn: str = "eager", **kw) -> Callable[[], torch.nn.Module]:
    config = tf.GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=16,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation=attn,
        **kw,
    )
    return _model(tf.GPT2LMHeadModel, config)


def _bert(attn: str) -> Callable[[], torch.nn.Module]:
    config = tf.BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=LABELS,
        attn_implementation=attn,
    )
    return _model(tf.BertForSequenceClassification, config)


def _transformers() -> Dict[str, Arch]:
    """Text (decoder-only and encoder), encoder-decoder, vision and audio."""
    return {
        "gpt2": Arch(_gpt2(), _text),
        # _upcast_and_reordered_attn computes the attention scores under
        # `torch.amp.autocast(device, enabled=False)` and raises "Error with upcasting" if the
        # scores come out of softmax in anything but float32.
        "gpt2_upcast": Arch(_gpt2(reorder_and_upcast_attn=True), _text),
        "gpt2_sdpa": Arch(_gpt2("sdpa"), _text),
        "bert": Arch(_bert("eager"), _classify_text),
        "bert_sdpa": Arch(_bert("sdpa"), _classify_text),
        "llama": Arch(
            _model(
                tf.LlamaForCausalLM,
                tf.LlamaConfig(
                    vocab_size=VOCAB,
                    hidden_size=16,
                    intermediate_size=32,
                    num_hidden_layers=2,
                    num_attention_heads=2,
                    num_key_value_heads=1,
                    max_position_embeddings=SEQ,
                    attn_implementation="eager",
                ),
            ),
            _text,
        ),
        "t5": Arch(
            _model(
                tf.T5ForConditionalGeneration,
                tf.T5Config(
                    vocab_size=VOCAB,
                    d_model=16,
                    d_kv=8,
                    d_ff=32,
                    num_layers=1,
                    num_decoder_layers=1,
                    num_heads=2,
                    relative_attention_num_buckets=8,
                    dropout_rate=0.0,
                    pad_token_id=0,
                    eos_token_id=1,
                    decoder_start_token_id=0,
                    attn_implementation="eager",
                ),
            ),
            _seq2seq,
        ),
        "bart": Arch(
            _model(
                tf.BartForConditionalGeneration,
                tf.BartConfig(
                    vocab_size=VOCAB,
                    d_model=16,
                    encoder_layers=1,
                    decoder_layers=1,
                    encoder_attention_heads=2,
                    decoder_attention_heads=2,
                    encoder_ffn_dim=32,
                    decoder_ffn_dim=32,
                    max_position_embeddings=SEQ,
                    dropout=0.0,
                    attention_dropout=0.0,
                    activation_dropout=0.0,
                    encoder_layerdrop=0.0,
                    decoder_layerdrop=0.0,
                    pad_token_id=1,
                    bos_token_id=0,
                    eos_token_id=2,
                    decoder_start_token_id=2,
                    attn_implementation="eager",
                ),
            ),
            _seq2seq,
        ),
        "vit": Arch(
            _model(
                tf.ViTForImageClassification,
                tf.ViTConfig(
                    image_size=8,
                    patch_size=4,
                    num_channels=3,
                    hidden_size=16,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    intermediate_size=32,
                    hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0,
                    num_labels=LABELS,
                    attn_implementation="eager",
                ),
            ),
            lambda g: _image(g, 8),
        ),
        "convnext": Arch(
            _model(
                tf.ConvNextForImageClassification,
                tf.ConvNextConfig(
                    num_channels=3,
                    patch_size=2,
                    num_stages=2,
                    hidden_sizes=[8, 16],
                    depths=[1, 1],
                    drop_path_rate=0.0,
                    num_labels=LABELS,
                ),
            ),
            lambda g: _image(g, 16),
        ),
        # BatchNorm: its running statistics move in a training step.
        "resnet": Arch(
            _model(
                tf.ResNetForImageClassification,
                tf.ResNetConfig(
                    num_channels=3,
                    embedding_size=8,
                    hidden_sizes=[8, 16],
                    depths=[1, 1],
                    layer_type="basic",
                    num_labels=LABELS,
                ),
            ),
            lambda g: _image(g, 16),
        ),
        # Convolutional feature encoder with group norm, a weight-normed positional convolution, CTC loss.
        "wav2vec2": Arch(
            _model(
                tf.Wav2Vec2ForCTC,
                tf.Wav2Vec2Config(
                    vocab_size=16,
                    hidden_size=16,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    intermediate_size=32,
                    conv_dim=(8, 8),
                    conv_stride=(4, 2),
                    conv_kernel=(8, 4),
                    num_conv_pos_embeddings=4,
                    num_conv_pos_embedding_groups=2,
                    hidden_dropout=0.0,
                    activation_dropout=0.0,
                    attention_dropout=0.0,
                    feat_proj_dropout=0.0,
                    final_dropout=0.0,
                    layerdrop=0.0,
                    mask_time_prob=0.0,
                    mask_feature_prob=0.0,
                    pad_token_id=0,
                    ctc_loss_reduction="mean",
                    attn_implementation="eager",
                ),
            ),
            _audio,
        ),
        "whisper": Arch(
            _model(
                tf.WhisperForConditionalGeneration,
                tf.WhisperConfig(
                    vocab_size=VOCAB,
                    num_mel_bins=8,
                    d_model=16,
                    encoder_layers=1,
                    decoder_layers=1,
                    encoder_attention_heads=2,
                    decoder_attention_heads=2,
                    encoder_ffn_dim=32,
                    decoder_ffn_dim=32,
                    max_source_positions=8,
                    max_target_positions=SEQ,
                    dropout=0.0,
                    attention_dropout=0.0,
                    activation_dropout=0.0,
                    encoder_layerdrop=0.0,
                    decoder_layerdrop=0.0,
                    pad_token_id=1,
                    bos_token_id=0,
                    eos_token_id=2,
                    decoder_start_token_id=0,
                    begin_suppress_tokens=None,
                    attn_implementation="eager",
                ),
            ),
            _mel,
        ),
    }


class Classifier(torch.nn.Module):
    """An image classifier with the loss a training loop computes inside the region: its
    output is ``{"logits", "loss"}``, as a ``transformers`` model's is."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> Dict[str, torch.Tensor]:
        logits = self.net(pixel_values)
        return {"logits": logits, "loss": F.cross_entropy(logits, labels)}


def _classifier(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build():
        torch.manual_seed(0)
        model = Classifier(make())
        # Zero-initialised weights (the last norm of a residual branch, torchvision ViT's head)
        # get small random values: with them every branch computes and every parameter gets a
        # gradient, so the comparison covers the whole model.
        with torch.no_grad():
            for m in model.modules():
                weight = getattr(m, "weight", None)
                if isinstance(weight, torch.nn.Parameter) and not weight.any():
                    weight.normal_(0.0, 0.1)
        return model

    return build


def _torchvision() -> Dict[str, Arch]:
    """Residual and mobile convolutional networks at their own size on 32x32 images, and tiny
    configs of the ViT and Swin transformers."""
    import torchvision.models as tv

    def arch(make: Callable[[], torch.nn.Module], size: int = 32) -> Arch:
        return Arch(_classifier(make), lambda g: _image(g, size), "torchvision")

    return {
        # BatchNorm, max pooling, residual additions.
        "tv_resnet18": arch(lambda: tv.resnet18(num_classes=LABELS)),
        # Hardswish, squeeze-and-excitation (adaptive average pooling, hardsigmoid).
        "tv_mobilenet_v3_small": arch(lambda: tv.mobilenet_v3_small(num_classes=LABELS, dropout=0.0)),
        # SiLU, depthwise convolutions, stochastic depth (off).
        "tv_efficientnet_b0": arch(
            lambda: tv.efficientnet_b0(num_classes=LABELS, dropout=0.0, stochastic_depth_prob=0.0)
        ),
        # Channel shuffle (view, transpose), channel split.
        "tv_shufflenet_v2": arch(lambda: tv.shufflenet_v2_x0_5(num_classes=LABELS)),
        # Patch embedding convolution, class token, torch's MultiheadAttention.
        "tv_vit": arch(
            lambda: tv.VisionTransformer(
                image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=LABELS
            )
        ),
        # Shifted windows (roll, masks), relative position bias, patch merging.
        "tv_swin": arch(
            lambda: tv.SwinTransformer(
                patch_size=[4, 4],
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 2],
                window_size=[2, 2],
                stochastic_depth_prob=0.0,
                num_classes=LABELS,
            )
        ),
    }


def _timm() -> Dict[str, Arch]:
    """Small timm models (``pretrained=False``), ViT from a tiny config."""
    import timm

    def arch(name: str, size: int = 32, **kw) -> Arch:
        kw = {k: v for k, v in {"drop_rate": 0.0, "drop_path_rate": 0.0, **kw}.items() if v is not None}
        return Arch(
            _classifier(lambda: timm.create_model(name, pretrained=False, num_classes=LABELS, **kw)),
            lambda g: _image(g, size),
            "timm",
        )

    return {
        # A tiered 3-conv stem, BatchNorm.
        "timm_resnet10t": arch("resnet10t"),
        # LayerNorm over channels, GELU, depthwise 7x7 convolutions, layer scale.
        "timm_convnext_atto": arch("convnext_atto"),
        # timm's own attention (fused: scaled_dot_product_attention), class token, 2 blocks.
        "timm_vit_tiny": arch("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2),
        # Universal inverted bottlenecks.
        "timm_mobilenetv4_small": arch("mobilenetv4_conv_small"),
        # Attention with BatchNorm'd linear layers, attention biases indexed by position, hardswish.
        "timm_levit_128s": arch("levit_128s", size=64, img_size=64),
        # Cascaded group attention; it takes no drop_path_rate. img_size: timm 1.0.29 (the GPU image's)
        # builds its attention biases for 224x224 unless told, and refuses 64x64 images.
        "timm_efficientvit_m0": arch("efficientvit_m0", size=64, img_size=64, drop_path_rate=None),
        # Squeeze-and-excitation, group convolutions.
        "timm_regnety_002": arch("regnety_002"),
    }


#: name -> architecture, of every library that imports.
ARCHS: Dict[str, Arch] = {}
#: library -> why its architectures are not in ``ARCHS``.
UNAVAILABLE: Dict[str, str] = {}
for _library, _archs in (("transformers", _transformers), ("torchvision", _torchvision), ("timm", _timm)):
    _module, _why = (tf, _TF_WHY) if _library == "transformers" else _import(_library)
    if _module is None:
        UNAVAILABLE[_library] = _why
    else:
        ARCHS.update(_archs())


def pair(name: str):
    """Two models with identical weights (ours, native) and one batch of inputs."""
    arch = ARCHS[name]
    ours = arch.build()
    return ours, copy.deepcopy(ours), arch.inputs(torch.Generator().manual_seed(1))


def tensors(output) -> Dict[str, torch.Tensor]:
    """The tensor fields of a model output (logits, loss, encoder states, ...), by name."""
    return {k: v for k, v in output.items() if isinstance(v, torch.Tensor)}
