"""Exporting an EAGLE head to the checkpoint layout vLLM and SGLang load.

Neither engine runs here, so the test rebuilds their EAGLE-1 forward from the exported files with
transformers' own ``LlamaDecoderLayer`` (its input norm replaced by the identity, as both engines
do in the first layer; ``fc`` on ``[embedding ; feature]``; the target's LM head on the layer's
output, no final norm) and checks it computes minispec's head.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tinymodels import tiny_llama
from torch import nn

from minispec.extra_drafters.eagle_head import EagleHead, save_head
from minispec.tools import export

pytestmark = pytest.mark.usefixtures("one_thread")


def eagle1_head(target, vocab=None, layout="eagle1") -> EagleHead:
    torch.manual_seed(5)
    head = EagleHead(target.config, vocab, layout=layout).bind(target).eval()
    with torch.no_grad():
        for param in head.parameters():
            param.normal_(0, 0.3) if param.ndim > 1 else param.uniform_(0.5, 1.5)
    return head.requires_grad_(False)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture
def exported(target, tmp_path):
    head = eagle1_head(target)
    save_head(head, tmp_path / "head", dtype=torch.float32)
    return head, export.export_head(tmp_path / "head", tmp_path / "out", dtype=torch.float32)


def test_names_shapes_and_config_are_eagle1s(target, exported):
    _, out = exported
    c = target.config
    D, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layer = {"self_attn.q_proj.weight": (q, D), "self_attn.k_proj.weight": (kv, D),
             "self_attn.v_proj.weight": (kv, D), "self_attn.o_proj.weight": (D, q),
             "post_attention_layernorm.weight": (D,),
             "mlp.gate_proj.weight": (c.intermediate_size, D),
             "mlp.up_proj.weight": (c.intermediate_size, D),
             "mlp.down_proj.weight": (D, c.intermediate_size)}
    expected = {"fc.weight": (D, 2 * D), "fc.bias": (D,),
                **{f"layers.0.{name}": shape for name, shape in layer.items()}}
    tensors = load_file(str(out / "model.safetensors"))
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    assert torch.equal(tensors["fc.bias"], torch.zeros(D))
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1
    for field in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta"):
        assert config[field] == getattr(c, field), field


def test_transformers_layer_with_the_exported_weights_computes_the_head(target, exported):
    """The engines' forward, rebuilt from the files, equals minispec's head to float rounding,
    with the engines' positions (the token's) one ahead of minispec's (the pair's)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    head, out = exported
    config = LlamaConfig.from_pretrained(out)
    config._attn_implementation = "eager"
    tensors = load_file(str(out / "model.safetensors"))
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    layer.input_layernorm = nn.Identity()
    layer.load_state_dict(   # strict: the files hold every weight the layer has, and no other
        {k.removeprefix("layers.0."): v for k, v in tensors.items() if k.startswith("layers.")})
    fc = nn.Linear(2 * config.hidden_size, config.hidden_size)
    fc.load_state_dict({"weight": tensors["fc.weight"], "bias": tensors["fc.bias"]})

    T = 7
    ids = torch.randint(0, config.vocab_size, (2, T))
    features = torch.randn(2, T, config.hidden_size)
    token_positions = torch.arange(1, T + 1).expand(2, T)
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]          # (1, 1, T, T)
    with torch.no_grad():
        h = fc(torch.cat([target.embed_tokens(ids), features], dim=-1))
        rope = LlamaRotaryEmbedding(config)(h, token_positions)
        y = layer(h, attention_mask=causal, position_ids=token_positions, position_embeddings=rope)
        y = y[0] if isinstance(y, tuple) else y
        logits, feature = head(ids, features, token_positions - 1)
    torch.testing.assert_close(feature, y, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits, y @ target.output_weight.T, atol=1e-4, rtol=1e-4)


def test_heads_the_engines_would_compute_differently_are_refused(target, tmp_path):
    save_head(eagle1_head(target, layout="minispec"), tmp_path / "minispec")
    with pytest.raises(ValueError, match="'minispec' layout"):
        export.export_head(tmp_path / "minispec", tmp_path / "out")
    save_head(eagle1_head(target, torch.arange(0, 48, 2)), tmp_path / "reduced")
    with pytest.raises(ValueError, match="full LM head"):
        export.export_head(tmp_path / "reduced", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="no EAGLE head"):
        export.export_head(tmp_path / "nothing", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_command_line_writes_half_precision_files(target, tmp_path, capsys):
    save_head(eagle1_head(target), tmp_path / "head")
    out = export.main([str(tmp_path / "head"), str(tmp_path / "out"), "--dtype", "bfloat16"])
    assert "exported" in capsys.readouterr().out
    tensors = load_file(str(out / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
