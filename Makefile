# diffrank: `make train` and `make test` install on a fresh machine when needed.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 2
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= offline

.PHONY: help install torchsort lapsum-reference data-ml100k train test test-library test-slow test-all bench gpu-check lint format report clean clean-outputs

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.14.1 torchvision==0.29.1
	# setuptools tells every editable install of a package-dir mapping (configs/ -> diffrank.configs) that it uses an
	# import finder ("BuildBackendWarning: Editable installation."): information, not a fault, so not printed
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e ".[experiments,embeddings,sweep,dev]"
	# fast soft sort's and LapSum's CPU kernels compiled ahead of time (~30 s; without a C compiler numba's JIT serves)
	-$(BIN)/python -m diffrank.operators.aot --build
	touch $(STAMP)

install: $(STAMP)  ## create .venv (Python 3.11, torch 2.14.1) and install diffrank with the dev extra

# torchsort (the C++ reference of fast soft sort / rank) is optional: its tests and bench rows skip without it.
# Its setup builds a CUDA extension whenever nvcc exists, which needs an arch list and libcudart to link.
CUDA_HOME ?= $(or $(lastword $(sort $(wildcard /usr/local/cuda-*))),/usr/local/cuda)
torchsort: $(STAMP)  ## optional: build torchsort 0.1.10 from source (~4 min), the fast-soft-sort reference
	TORCH_CUDA_ARCH_LIST="$${TORCH_CUDA_ARCH_LIST:-9.0}" LIBRARY_PATH="$(CUDA_HOME)/lib64:$$LIBRARY_PATH" \
		$(BIN)/python -m pip install -q --no-build-isolation torchsort==0.1.10

# The official LapSum CPU extension (Struski et al. 2025, MIT; never vendored): a benchmark and parity reference.
# DIFFRANK_LAPSUM_OFFICIAL names a checkout of the official LapSum code (the variable the benchmark reads too);
# JIT-compiled into ~/.cache/diffrank/lapsum_official. Without it its bench rows and tests skip.
lapsum-reference: $(STAMP)  ## optional: JIT-build the official LapSum C++ extension from $DIFFRANK_LAPSUM_OFFICIAL (~1.5 min)
	@test -n "$(DIFFRANK_LAPSUM_OFFICIAL)" || { echo "set DIFFRANK_LAPSUM_OFFICIAL to a checkout of the official LapSum code"; exit 2; }
	DIFFRANK_LAPSUM_OFFICIAL="$(DIFFRANK_LAPSUM_OFFICIAL)" $(BIN)/python -m diffrank.benchmark.lapsum_reference --build

# MovieLens-100K (GroupLens) as RecBole ships it: the wheel holds recbole/dataset_example/ml-100k/ml-100k.inter, read
# from the wheel itself (diffrank.experiments.data.movielens); nothing is unpacked. Into $DIFFRANK_DATA, else data/.
ML100K_DIR := $(or $(DIFFRANK_DATA),data)/recbole
data-ml100k: $(STAMP)  ## download the RecBole 1.2.1 wheel holding MovieLens-100K into $DIFFRANK_DATA/recbole (~2 MB)
	$(BIN)/python -m pip download -q recbole==1.2.1 --no-deps -d "$(ML100K_DIR)"

train: $(STAMP)  ## run the default experiment: operator=sinkhorn pk=half_top5 on digits100 (real data)
	$(BIN)/python train.py $(ARGS)

test: $(STAMP)  ## the default test suite (not slow, not gpu), under 15 minutes on 2 cores
	$(BIN)/python -m pytest -m "not slow and not gpu" $(ARGS)

test-library: $(STAMP)  ## the library's tests where only its dependencies are importable (devtools/library_env.py)
	$(BIN)/python devtools/library_env.py $(ARGS)

test-slow: $(STAMP)  ## the slow tests (all sizes, sweeps, full experiments)
	$(BIN)/python -m pytest -m "slow and not gpu" $(ARGS)

test-all: $(STAMP)  ## every test that runs on this machine
	$(BIN)/python -m pytest -m "not gpu" $(ARGS)

bench: $(STAMP)  ## benchmark tables: ours vs the peer libraries (time, peak memory)
	$(BIN)/python -m diffrank.benchmark $(ARGS)

# On a GPU machine: the Python that has CUDA torch and Triton (this checkout's .venv when there is one, else
# python3 with `pip install -e .` done), offline; docs/gpu.md. ARGS="--budget 420 --peer-src DIR --data-dir DIR".
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:  ## on a GPU machine: GPU tests, every operator vs peers and torch.sort, Table 3.9, sets/s (at most ~7 min, docs/gpu.md) -> outputs/gpu_check
	$(GPU_PY) -m diffrank.benchmark.gpu --out outputs/gpu_check $(ARGS)

report: $(STAMP)  ## compare the archived runs (results/) and every results.json under outputs/ with the papers' tables
	$(BIN)/python -m diffrank.experiments.analysis.report results $(wildcard outputs) $(ARGS)

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check .

format: $(STAMP)  ## ruff format + fixes
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

clean:  ## remove caches (keeps .venv and outputs)
	rm -rf .pytest_cache .ruff_cache build *.egg-info src/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-outputs:  ## remove Hydra run folders
	rm -rf outputs
