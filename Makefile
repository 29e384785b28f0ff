# `make demo` and `make test` work on a fresh clone of a fresh machine: they create .venv
# if it is missing, install the project into it, then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch; installed first where there is no CUDA so that the project's
# unpinned `torch` requirement is already met and no CUDA packages are pulled.
CPU_TORCH ?= torch==2.13.0
DEMO_DB ?= db/demo.db
DEMO_REPORT ?= reports/demo
# When this make started (UTC): the demo's report covers what the demo itself ran.
DEMO_START := $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
CLI := $(VENV)/bin/cs336sys
REPORT = $(CLI) report --db $(DEMO_DB) --since $(DEMO_START) --out $(DEMO_REPORT)

.PHONY: install test test-slow test-all test-fast demo demo-yours demo-full lint bench clean-venv browser \
	gpu-check gpu-owed wheels docs

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "CUDA found: installing the project's torch requirement as is"; \
	else \
		echo "no CUDA: installing the CPU build $(CPU_TORCH) first"; \
		$(PY) -m pip install -q "$(CPU_TORCH)"; \
	fi
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# The suite on every core (pytest-xdist): one worker per core (`auto`); tests/conftest.py says
# which tests share a worker. PYTEST_WORKERS=0: all in this one process.
PYTEST_WORKERS ?= auto
# PYTHONDONTWRITEBYTECODE emptied: pytest keeps the test modules it rewrote (assertions) in
# __pycache__, where a later run finds them; rewriting them all took 5 s of every worker.
PYTEST = PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(PYTEST_WORKERS)

# `make test`: every test not marked slow (about a second of CPU or more), under two minutes on
# two cores; `make test-slow`: the tests marked slow; `make test-all`: the whole suite in one
# run. CI (.ci/run) runs `make test`, then `make test-slow`: no test is left out of CI.
test: $(STAMP) browser
	$(PYTEST) -m "not slow"

test-slow: $(STAMP) browser
	$(PYTEST) -m slow

test-all: $(STAMP) browser
	$(PYTEST)

# The fast tests' old name, from when `make test` ran the whole suite; kept for a release.
test-fast: test

# `make docs`: the site (mkdocs.yml, pages in docs/) into site/, strict: a broken link, a
# missing page or a warning from a plugin fails the build. The docs extra comes on top of
# the project's install, once per change of pyproject.toml.
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[dev,docs]'
	@touch $(DOCS_STAMP)

# NO_MKDOCS_2_WARNING: Material's banner about its successor, not a warning about the site.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The report tests open the HTML in headless Chromium and read its PDF with poppler's
# pdftotext, from Debian's packages. Installed here when missing and apt-get can run (as
# root); otherwise those tests say how.
browser:
	@if (command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1) \
		&& command -v pdftotext >/dev/null 2>&1; then \
		true; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium and poppler-utils (Debian packages) for the report tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
			poppler-utils >/dev/null) \
			|| echo "apt-get could not install chromium/poppler-utils: the report browser tests will fail"; \
	else \
		echo "chromium or pdftotext not found and cannot be installed here: the report browser tests will fail"; \
	fi

# `make demo`: a first run in minutes -- one small sweep of each kind of
# experiment into $(DEMO_DB), then the report of exactly those runs. fp32 only: bf16/fp16 are
# emulated (and 30x slower) on CPUs without AVX512-BF16/FP16; `make demo-full` has them.
demo: $(STAMP)
	$(CLI) model --db $(DEMO_DB) --size tiny --seq 64,128 --batch 4 --mode forward,train \
		--warmup 1 --iters 3
	$(CLI) attention --db $(DEMO_DB) --attention naive,sdpa,flash-torch --seq 128,256 \
		--d-head 32 --batch 2 --warmup 1 --iters 5
	$(CLI) comm --db $(DEMO_DB) --op all-reduce,all-gather --bytes 1MB,10MB --world-size 2 \
		--warmup 1 --iters 5
	$(CLI) ddp --db $(DEMO_DB) --world-size 2 --seq 64 --impl flat,bucketed,torch,fsdp \
		--bucket-mb 1 --warmup 1 --iters 2
	$(CLI) memory --db $(DEMO_DB) --size tiny --seq 128 --batch 2 --mode train \
		--checkpoint none,every:1 --warmup 1 --iters 5
	$(CLI) precision accumulate --db $(DEMO_DB)
	$(CLI) profile model --db $(DEMO_DB) --size tiny --seq 64 --batch 2 --warmup 1 --iters 2 \
		--top 8
	$(CLI) step --db $(DEMO_DB) --size tiny --seq 64 --batch 2 \
		--switches none,fused-adamw,fused-ce,fused-adamw+fused-ce --warmup 1 --iters 3
	$(CLI) plan --db $(DEMO_DB) --size 8b --hardware h100,b200 --strategy dp,fsdp,tp,fsdp-tp \
		--n 2,4,8,16
	$(REPORT) --title "cs336sys demo (a first run: small CPU sweeps)"

# `make demo-yours`: a student's code measured beside ours (docs/yours.md), from the
# course-layout example in examples/course-layout/: their FlashAttention-2 in PyTorch
# checked against float64, their DDP and sharded optimizer against single-process training,
# the course's model against ours with the same weights; an unimplemented FSDP is a skipped
# row. Its own store and report folder.
DEMO_YOURS_DB ?= db/demo-yours.db
DEMO_YOURS_REPORT ?= reports/demo-yours
YOURS := --db $(DEMO_YOURS_DB) --adapters examples/course-layout/tests/adapters.py
demo-yours: $(STAMP)
	$(CLI) attention $(YOURS) --impl yours-torch,flash-torch,naive --seq 128,256 \
		--d-head 32 --batch 2 --warmup 1 --iters 5
	$(CLI) ddp $(YOURS) --impl yours,bucketed,yours-fsdp --shard-optimizer yours \
		--world-size 2 --seq 64 --bucket-mb 1 --warmup 1 --iters 3
	$(CLI) model $(YOURS) --model cs336_basics --size tiny --seq 64,128 --batch 4 \
		--warmup 1 --iters 3
	$(CLI) model $(YOURS) --attention yours-torch,naive --size tiny --seq 128 --batch 4 \
		--warmup 1 --iters 3
	$(CLI) report --db $(DEMO_YOURS_DB) --since $(DEMO_START) --out $(DEMO_YOURS_REPORT) \
		--title "cs336sys demo: your code beside ours (examples/course-layout)"

# `make demo-full`: the CPU-sized sweeps of everything: end-to-end model timing in fp32 and
# bf16 (then its stored table), attention implementations side by side (the Triton kernels
# through the interpreter), collectives, the DDP variants and the sharded ones (optimizer
# state, FSDP) on two Gloo ranks, precision experiments, profiles, and a memory sweep with
# checkpointing; then the report of exactly those runs.
demo-full: $(STAMP)
	$(CLI) model --db $(DEMO_DB) --size tiny --seq 64,128 \
		--batch 4 --mode forward,train --precision fp32,bf16 --warmup 2 --iters 5
	$(CLI) attention --db $(DEMO_DB) --attention naive,sdpa,flash-torch \
		--seq 128,256,512 --d-head 32,64 --batch 4 --warmup 2 --iters 10
	TRITON_INTERPRET=1 $(CLI) attention --db $(DEMO_DB) --attention triton \
		--device cpu --seq 64 --d-head 32 --batch 1 --warmup 1 --iters 2
	$(CLI) comm --db $(DEMO_DB) --op all-reduce,all-gather,reduce-scatter,broadcast \
		--bytes 1MB,10MB --world-size 2 --warmup 2 --iters 10
	$(CLI) ddp --db $(DEMO_DB) --world-size 2 --seq 64 \
		--bucket-mb 1,10,100 --warmup 1 --iters 3
	$(CLI) ddp --db $(DEMO_DB) --world-size 2 --seq 64 \
		--impl torch,fsdp,torch-fsdp --shard-optimizer --zero --warmup 1 --iters 3
	$(CLI) memory --db $(DEMO_DB) --size tiny --seq 256 \
		--batch 4 --mode forward,train --checkpoint none,every:1,sqrt --warmup 1 --iters 2
	$(CLI) memory --db $(DEMO_DB) --size tiny --seq 256 \
		--batch 4 --mode train --warmup 1 --iters 1 --snapshot $(DEMO_REPORT)/snapshots
	$(CLI) memory residuals --db $(DEMO_DB) --size tiny --seq 128
	$(CLI) precision accumulate --db $(DEMO_DB)
	$(CLI) precision autocast --db $(DEMO_DB) --precision bf16,fp16
	$(CLI) profile model --db $(DEMO_DB) --size tiny --seq 64 \
		--batch 4 --warmup 2 --iters 3 --top 8
	$(CLI) profile attention --db $(DEMO_DB) --attention naive,sdpa --seq 256 \
		--d-head 64 --batch 4 --heads 4 --warmup 2 --iters 5 --top 5
	$(CLI) step --db $(DEMO_DB) --size tiny --seq 128 --batch 4 \
		--switches none,fused-adamw,fused-ce,fused-adamw+fused-ce --checkpoint none,sqrt \
		--warmup 1 --iters 5
	$(CLI) plan --db $(DEMO_DB) --size 8b --hardware a100,h100,h200,b200 \
		--strategy dp,fsdp,tp,fsdp-tp --n 2,4,8,16,64
	$(CLI) sql --db $(DEMO_DB) \
		"SELECT size, seq AS ctx, mode, precision, status, \
		        round(fwd_ms_mean, 1) AS fwd_ms, round(bwd_ms_mean, 1) AS bwd_ms, \
		        round(opt_ms_mean, 1) AS opt_ms, round(step_ms_mean, 1) AS step_ms, \
		        round(tokens_per_s) AS tokens_per_s, round(tflops, 4) AS tflops \
		   FROM model_runs \
		  WHERE invocation_id = (SELECT id FROM invocations WHERE command = 'model' \
		                          ORDER BY started DESC LIMIT 1) \
		  ORDER BY created"
	$(REPORT) --title "cs336sys demo (CPU-sized sweeps)"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/cli_startup.py
	$(PY) benchmarks/attention_memory.py
	$(PY) benchmarks/comm_overhead.py
	$(PY) benchmarks/ddp_cpu.py
	$(PY) benchmarks/memory_cpu.py
	$(PY) benchmarks/sharding_cpu.py
	$(PY) benchmarks/report_speed.py
	$(PY) benchmarks/stop_time.py
	$(PY) benchmarks/rank_start.py
	$(PY) benchmarks/check_tolerances.py
	$(PY) benchmarks/shard_locate.py

# On a GPU host where torch and Triton are installed and nothing can be downloaded (docs/gpu.md,
# "make gpu-check"): the checkout runs as it is, with the system's Python, and sqlite-utils and the
# two packages it needs that such hosts lack arrive as wheels in $(WHEELS), made beforehand by
# `make wheels` on a machine that reaches the registry.
GPU_PYTHON ?= python3
WHEELS ?= .whl
GPU_SITE ?= /tmp/cs336sys-site
GPU_WHEELS := sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4

# The wheels of $(WHEELS), when there are any, into $(GPU_SITE) (put on PYTHONPATH below).
define GPU_WHEELS_INSTALL
@if ls $(WHEELS)/*.whl >/dev/null 2>&1; then \
	$(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --upgrade --root-user-action=ignore \
		--target $(GPU_SITE) $(WHEELS)/*.whl; \
fi
endef

gpu-check:
	$(GPU_WHEELS_INSTALL)
	@PYTHONPATH=$(CURDIR):$(GPU_SITE) $(GPU_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# `make gpu-owed`: the GPU figures the issues still owe (benchmarks/gpu_owed.py --list),
# cheapest first, into reports/<gpu>/owed/; same setup as gpu-check.
gpu-owed:
	$(GPU_WHEELS_INSTALL)
	@PYTHONPATH=$(CURDIR):$(GPU_SITE) $(GPU_PYTHON) benchmarks/gpu_owed.py $(GPU_OWED_ARGS)

wheels: $(STAMP)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d $(WHEELS) \
		$(GPU_WHEELS)

clean-venv:
	rm -rf $(VENV)
