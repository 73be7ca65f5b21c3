#!/usr/bin/env bash
# Train an EAGLE-3-style head for SmolLM2-135M-Instruct on one CUDA GPU (issue 42, step 3).
#
#   bash benchmarks/eagle3_gpu.sh                # the GPU run: the head lands in minispec/zoo/
#   EAGLE3_DRY=1 bash benchmarks/eagle3_gpu.sh   # a tiny CPU dry run (shakespeare-target)
#
# Stages (python -m minispec.tools.train_eagle --layout eagle3; see its docstring):
#   1. data: the target's own answers, written by minispec's engine at --gen-batch requests at
#      once, SAMPLES answers per prompt at temperature 0.7 (the prompt set has ~1,500 prompts),
#      turned into the streams entering layers 2, 15, 27 plus the final features (float16);
#   2. training: TRAIN_MIN minutes, EAGLE-3's layout (fc on the three layers, a first layer
#      reading [embedding ; fused], the head's own final norm and frozen LM head over V'),
#      3 unrolled passes, loss 0.5 CE + 1.0 KL(p || q) (no feature term);
#   3. evaluation: held-out top-1 by draft position (training.json) and alpha / tokens per
#      target forward on minispec's evaluation tasks, checked token for token (MODEL_CARD.md);
#   4. the head and its card copied to minispec/zoo/$NAME (NOT registered in zoo.HEADS: a
#      person checks the card first);
#   5. the head exported in the speculators format vLLM loads, to $OUT/speculators
#      (python -m minispec.tools.export; the verifier it names: $VERIFIER).
#
# Memory: every token keeps 4 x 576 float16 values (3 layers + the final feature), 4.6 kB; 10 M
# tokens are ~46 GB of host memory and of --out/data.pt (the disk is 64 GiB: OUT on that disk,
# nothing else large there).
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=${NAME:-smollm2-135m-instruct-eagle3}
OUT=${OUT:-runs/eagle3}
if [[ "${EAGLE3_DRY:-0}" == 1 ]]; then      # CPU, tiny: checks the pipeline end to end
    ARGS=(--target shakespeare-target --device cpu --threads 1 --prompts 4 --samples 2
          --answer-tokens 16 --prose-chars 2000 --code-chars 2000 --chunk 64 --batch 2
          --gen-batch 128 --steps 4 --eval-every 2 --eval-tokens 12 --time-budget 1
          --aux-layers 1 3 5)                 # three distinct layers, as vLLM captures them
    ZOO=${ZOO:-$OUT/zoo}                     # never the real zoo from a dry run
    VERIFIER=${VERIFIER:-shakespeare-target}  # a name in config.json only (not on the Hub)
else
    ARGS=(--target smollm2-135m-instruct --device cuda --docstrings 2000 --prompts 100000
          --samples "${SAMPLES:-16}" --answer-tokens 512 --gen-batch "${GEN_BATCH:-256}"
          --prose-chars 4000000 --code-chars 4000000 --chunk 512 --batch 64 --lr 3e-4
          --warmup 200 --steps 100000 --eval-every 500 --time-budget "${TRAIN_MIN:-6}"
          --eval-tokens 128)
    ZOO=${ZOO:-minispec/zoo}
    VERIFIER=${VERIFIER:-HuggingFaceTB/SmolLM2-135M-Instruct}
fi

mkdir -p "$OUT"
start=$(date +%s)
python -m minispec.tools.train_eagle --out "$OUT" --name "$NAME" --layout eagle3 \
    --temperature 0.7 "${ARGS[@]}" "$@"
end=$(date +%s)

python - "$OUT" <<'PY'
import json, sys
facts = json.load(open(f"{sys.argv[1]}/training.json"))
tokens = facts["data"]["tokens_by_source"]
print("tokens by source:", tokens, "total", sum(tokens.values()))
print("data built in %.1f min, trained %d steps in %.1f min" % (
    facts["data"]["build_minutes"], facts["training"]["steps"], facts["training"]["minutes"]))
print("held-out top-1 by draft position:",
      [round(x, 3) for x in facts["training"]["heldout_top1_by_position"]])
for task, row in facts["evaluation"]["by_task"].items():
    print(f"{task:>14}: alpha {row['eagle']['alpha']:.2f}, tokens/forward "
          f"{row['eagle']['tokens_per_forward']:.2f} (prompt lookup "
          f"{row['prompt_lookup']['tokens_per_forward']:.2f})")
PY

mkdir -p "$ZOO/$NAME"
cp "$OUT/head/head.safetensors" "$OUT/head/eagle_config.json" "$OUT/head/MODEL_CARD.md" \
    "$ZOO/$NAME/"
python -m minispec.tools.export "$OUT/head" "$OUT/speculators" --overwrite --verifier "$VERIFIER"
echo "head and card in $ZOO/$NAME, the speculators export in $OUT/speculators" \
     "($(( (end - start) / 60 )) min in all)"
