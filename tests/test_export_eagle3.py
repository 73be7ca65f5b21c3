"""The ``"eagle3"`` head and its export in the speculators format, which vLLM loads.

vLLM does not run here, and the ``speculators`` package pins a torch and a transformers other than
this project's, so the test rebuilds the EAGLE-3 forward of vLLM's ``llama_eagle3.py`` (and of
speculators' ``Eagle3DraftModel``) from the exported files alone, with transformers' Llama pieces:
``fc`` on the target's three layers, then one layer whose attention reads
``[input_layernorm(embed) ; hidden_norm(g)]`` and whose residual is ``g``, the head's own ``norm``
and ``lm_head``, and ``d2t`` mapping draft ids to target ids. The target's layers come from
transformers' own ``LlamaForCausalLM`` (``hidden_states[i]`` for each id the config names), so the
layer ids are checked too. The only thing taken from outside the files is the verifier's
embedding, as vLLM takes it.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_CONFIGS, save_hf_model
from safetensors.torch import load_file
from test_eagle import PROMPTS, spied_rounds
from torch import nn

import minispec as ms
from minispec.extra_drafters.eagle import EagleDrafter, full_vocab
from minispec.extra_drafters.eagle_head import EagleHead, load_head, save_head
from minispec.loading.loader import load
from minispec.tools import export

pytestmark = pytest.mark.usefixtures("one_thread")

AUX = (1, 2, 3)
NEW = 16


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A 4-layer transformers Llama (MQA, head_dim 24, attention and MLP biases, Llama-3 RoPE,
    untied) and minispec's load of it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(initializer_range=0.25,
                         **TINY_CONFIGS["mqa-headdim-bias"] | {"num_hidden_layers": 4})
    hf = LlamaForCausalLM(config).eval()
    target, _ = load(save_hf_model(hf, tmp_path_factory.mktemp("verifier")))
    return hf, target


def random_eagle3_head(target, vocab=None, seed=5) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(target.config, vocab, layout="eagle3", aux_layers=AUX).bind(target).eval()
    with torch.no_grad():
        for param in head.parameters():
            param.normal_(0, 0.3) if param.ndim > 1 else param.uniform_(0.5, 1.5)
    return head.requires_grad_(False)


@pytest.fixture(scope="module")
def exported(pair, tmp_path_factory):
    _, target = pair
    head = random_eagle3_head(target, torch.arange(3, target.config.vocab_size, 3))
    tmp = tmp_path_factory.mktemp("eagle3")
    save_head(head, tmp / "head", dtype=torch.float32)
    return head, export.export_head(tmp / "head", tmp / "out", dtype=torch.float32)


class Reference(nn.Module):
    """vLLM's EAGLE-3 Llama head rebuilt from ``config.json`` and ``model.safetensors`` with
    transformers' Llama modules, and the verifier's embedding."""

    def __init__(self, out, embedding: torch.Tensor) -> None:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRMSNorm,
            LlamaRotaryEmbedding,
        )

        super().__init__()
        self.spec = json.loads((out / "config.json").read_text())
        c = LlamaConfig(**self.spec["transformer_layer_config"])
        c._attn_implementation = "eager"
        D, V, bias = c.hidden_size, self.spec["draft_vocab_size"], c.attention_bias
        self.embed = nn.Embedding.from_pretrained(embedding)
        self.fc = nn.Linear(3 * D, D, bias=False)
        self.layers = nn.ModuleList([LlamaDecoderLayer(c, layer_idx=0)])
        attn = self.layers[0].self_attn
        attn.q_proj = nn.Linear(2 * D, c.num_attention_heads * c.head_dim, bias=bias)
        attn.k_proj = nn.Linear(2 * D, c.num_key_value_heads * c.head_dim, bias=bias)
        attn.v_proj = nn.Linear(2 * D, c.num_key_value_heads * c.head_dim, bias=bias)
        self.layers[0].hidden_norm = LlamaRMSNorm(D, eps=c.rms_norm_eps)
        self.norm = LlamaRMSNorm(D, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.rope = LlamaRotaryEmbedding(c)
        tensors = load_file(str(out / "model.safetensors"))
        d2t = tensors.pop("d2t", torch.zeros(V, dtype=torch.long))
        tensors.pop("t2d", None)
        self.load_state_dict(tensors | {"embed.weight": embedding})   # strict: every name used
        self.targets = torch.arange(V) + d2t                 # draft id -> target id (vLLM's)
        self.vocab_size = c.vocab_size
        assert not self.spec["norm_before_residual"]

    def forward(self, ids, aux, positions, hidden=None):
        """Full-vocabulary logits (-inf outside the draft vocabulary) and the pre-norm output that
        vLLM passes on; ``aux`` (B, T, 3D) the target's layers, or ``hidden`` (B, T, D) the fused
        or passed-on features."""
        layer, T = self.layers[0], ids.shape[1]
        g = self.fc(aux) if hidden is None else hidden
        x = torch.cat([layer.input_layernorm(self.embed(ids)), layer.hidden_norm(g)], dim=-1)
        causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
        attn = layer.self_attn(x, position_embeddings=self.rope(x, positions),
                               attention_mask=causal)[0]
        h = g + attn
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = self.lm_head(self.norm(h))
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.targets] = logits
        return full, h


def hf_layers(hf, ids: torch.Tensor, layer_ids) -> torch.Tensor:
    """transformers' ``hidden_states[i]`` for each id, concatenated (B, T, 3D)."""
    with torch.no_grad():
        states = hf(ids, output_hidden_states=True).hidden_states
    return torch.cat([states[i] for i in layer_ids], dim=-1)


def test_names_shapes_and_config_are_speculators(pair, exported):
    _, target = pair
    head, out = exported
    c, V = target.config, head.draft_vocab_size
    D, F = c.hidden_size, c.intermediate_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {"fc.weight": (D, 3 * D), "norm.weight": (D,), "lm_head.weight": (V, D),
              "d2t": (V,), "t2d": (c.vocab_size,)}
    layer = {"input_layernorm.weight": (D,), "hidden_norm.weight": (D,),
             "post_attention_layernorm.weight": (D,),
             "self_attn.q_proj.weight": (q, 2 * D), "self_attn.q_proj.bias": (q,),
             "self_attn.k_proj.weight": (kv, 2 * D), "self_attn.k_proj.bias": (kv,),
             "self_attn.v_proj.weight": (kv, 2 * D), "self_attn.v_proj.bias": (kv,),
             "self_attn.o_proj.weight": (D, q), "self_attn.o_proj.bias": (D,),
             "mlp.gate_proj.weight": (F, D), "mlp.gate_proj.bias": (F,),
             "mlp.up_proj.weight": (F, D), "mlp.up_proj.bias": (F,),
             "mlp.down_proj.weight": (D, F), "mlp.down_proj.bias": (D,)}
    shapes |= {f"layers.0.{name}": shape for name, shape in layer.items()}
    tensors = load_file(str(out / "model.safetensors"))
    assert {name: tuple(t.shape) for name, t in tensors.items()} == shapes
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert torch.equal(torch.arange(V) + tensors["d2t"], head.vocab)
    assert torch.equal(tensors["t2d"].nonzero()[:, 0], head.vocab)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and "model_type" not in config
    assert config["architectures"] == ["Eagle3Speculator"]
    assert config["eagle_aux_hidden_state_layer_ids"] == list(AUX)
    assert config["draft_vocab_size"] == V and config["norm_before_residual"] is False
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["proposal_methods"][0]["speculative_tokens"] >= 1
    assert spec["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    layer_config = config["transformer_layer_config"]
    assert layer_config["model_type"] == "llama" and layer_config["num_hidden_layers"] == 1
    for field in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "intermediate_size", "rms_norm_eps", "attention_bias", "mlp_bias"):
        assert layer_config[field] == getattr(c, field), field


def test_the_exported_files_compute_the_head(pair, exported):
    """The reference forward from the files, on transformers' own layers of the verifier, equals
    minispec's head on minispec's taps: the fused features, the logits over the full vocabulary
    and the pre-norm output, at every position (the reference's positions one ahead)."""
    hf, target = pair
    head, out = exported
    ref = Reference(out, hf.model.embed_tokens.weight.detach()).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, target.config.vocab_size, (2, 10))
    aux = hf_layers(hf, ids[:, :-1], ref.spec["eagle_aux_hidden_state_layer_ids"])   # (2, 9, 3D)
    with torch.no_grad():
        _, taps = target(ids[:, :-1], torch.arange(9).expand(2, 9), return_hidden=head.aux_layers)
        torch.testing.assert_close(taps, aux, atol=1e-4, rtol=1e-4)
        logits, feature = head(ids[:, 1:], taps, torch.arange(9).expand(2, 9))
        want, h = ref(ids[:, 1:], aux, torch.arange(1, 10).expand(2, 9))
    torch.testing.assert_close(feature, h, atol=1e-4, rtol=1e-4)
    got = full_vocab(head, logits.reshape(18, -1)).reshape(2, 9, -1)
    assert torch.equal(got.isinf(), want.isinf())
    torch.testing.assert_close(got[got.isfinite()], want[want.isfinite()], atol=1e-4, rtol=1e-4)


def reference_drafts(ref: Reference, hf, context: list[int], k: int) -> list[int]:
    """vLLM's greedy chain without a cache: the verifier's layers over ``context[:-1]``, then the
    reference's own pre-norm outputs for the drafts after the first."""
    ids = torch.tensor([context[1:]])
    with torch.no_grad():
        hidden = ref.fc(hf_layers(hf, torch.tensor([context[:-1]]),
                                  ref.spec["eagle_aux_hidden_state_layer_ids"]))
        drafts = []
        for _ in range(k):
            n = ids.shape[1]
            logits, h = ref(ids, None, torch.arange(1, n + 1)[None], hidden=hidden)
            drafts.append(int(logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[drafts[-1]]])], dim=1)
            hidden = torch.cat([hidden, h[:, -1:]], dim=1)
    return drafts


@pytest.mark.parametrize("driver", ["single", "engine"])
def test_the_drafters_greedy_drafts_are_the_exported_heads(pair, exported, driver):
    """Round by round, the EagleDrafter's drafts (cached, batched) are the drafts the exported
    files make in vLLM's loop, and the output is the target's greedy output."""
    hf, target = pair
    head, out = exported
    ref = Reference(out, hf.model.embed_tokens.weight.detach()).eval()
    spy = spied_rounds(target, head, driver, NEW)
    assert len(spy.rounds) > 10
    for context, k, drafts in spy.rounds:
        assert drafts == reference_drafts(ref, hf, context, k)


@pytest.mark.parametrize("branching", [None, (2, 2, 1)])
def test_an_eagle3_head_drafts_exactly(pair, exported, branching):
    _, target = pair
    head, _ = exported
    for prompt in PROMPTS[:4]:
        out = ms.speculative_generate(target, EagleDrafter(head), prompt, NEW, k=3,
                                      branching=branching)
        assert out.tokens == ms.generate(target, prompt, NEW).tokens


def test_save_load_and_a_start_from_the_target(pair, exported, tmp_path):
    """``save_head``/``load_head`` keep the layout and every weight; ``init_from_target`` makes a
    head whose layer is the target's last one over the stream entering it, so its first draft
    is the target's own next-token law over ``V'``."""
    _, target = pair
    head, _ = exported
    save_head(head, tmp_path, dtype=torch.float32)
    loaded = load_head(tmp_path, target)
    assert loaded.layout == "eagle3" and loaded.aux_layers == AUX
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 head.state_dict().values(), strict=True))
    start = EagleHead(target.config, head.vocab, layout="eagle3", aux_layers=AUX)
    start.bind(target).init_from_target()
    ids, pos = torch.tensor([[5, 9, 2, 7, 1, 4]]), torch.arange(6)[None]
    with torch.no_grad():
        logits, taps = target(ids, pos, return_hidden=AUX)
        mine, _ = start(ids, taps, pos)
    torch.testing.assert_close(mine, logits[..., head.vocab], atol=1e-4, rtol=1e-4)


def test_the_command_line_picks_the_speculators_layout(pair, tmp_path, capsys):
    _, target = pair
    save_head(random_eagle3_head(target), tmp_path / "head")
    out = export.main([str(tmp_path / "head"), str(tmp_path / "out"), "--verifier", "my/target"])
    assert "exported" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "my/target"
    assert config["draft_vocab_size"] == target.config.vocab_size
    tensors = load_file(str(out / "model.safetensors"))
    assert "d2t" not in tensors and tensors["fc.weight"].dtype == torch.float16


def test_speculators_own_model_loads_the_files_and_computes_the_head(pair, exported):
    """Where the ``speculators`` package is installed (not a dependency: it pins its own torch
    and transformers), its ``Eagle3DraftModel`` reads the config, loads every exported tensor
    (the embedding and the verifier's parts come from the verifier) and computes the head's
    logits over ``V'``."""
    pytest.importorskip("speculators")
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel

    hf, target = pair
    head, out = exported
    config = SpeculatorModelConfig.from_pretrained(out)
    config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel(config).eval()
    missing, unexpected = model.load_state_dict(load_file(str(out / "model.safetensors")),
                                                strict=False)
    assert not unexpected and set(missing) == {"embed_tokens.weight", "verifier_lm_head.weight",
                                               "verifier_norm.weight"}
    model.embed_tokens.weight.data.copy_(hf.model.embed_tokens.weight)
    ids, seen = torch.randint(0, target.config.vocab_size, (1, 10)), {}
    model.lm_head.register_forward_hook(lambda module, args, out: seen.setdefault("logits", out))
    with torch.no_grad():
        aux = hf_layers(hf, ids[:, :-1], config.eagle_aux_hidden_state_layer_ids)
        model(aux, ids[:, 1:], torch.zeros(1, 9, dtype=torch.long), ttt_steps=1)
        _, taps = target(ids[:, :-1], torch.arange(9)[None], return_hidden=head.aux_layers)
        logits, _ = head(ids[:, 1:], taps, torch.arange(9)[None])
    torch.testing.assert_close(seen["logits"], logits, atol=1e-4, rtol=1e-4)
