# `make demo` and `make test` work on a fresh clone of a fresh machine: they create .venv
# if it is missing, install the project into it, then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch; installed first where there is no CUDA so that the project's
# unpinned `torch` requirement is already met and no CUDA packages are pulled.
CPU_TORCH ?= torch==2.13.0
DEMO_DB ?= db/results.db
DEMO_REPORT ?= reports/demo
# When this make started (UTC): the demo's report covers what the demo itself ran.
DEMO_START := $(shell date -u +%Y-%m-%dT%H:%M:%S)

.PHONY: install test demo lint bench clean-venv browser gpu-check wheels

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

test: $(STAMP) browser
	$(PY) -m pytest -q

# The report tests open the HTML in headless Chromium, from Debian's packages. Installed
# here when missing and apt-get can run (as root); otherwise those tests say how.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		true; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium (Debian package) for the report tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
			>/dev/null) || echo "apt-get could not install chromium: the report browser tests will fail"; \
	else \
		echo "chromium not found and cannot be installed here: the report browser tests will fail"; \
	fi

# CPU-sized sweeps into $(DEMO_DB): end-to-end model timing (then its stored table),
# attention implementations side by side (the Triton kernels through the interpreter),
# collectives, the DDP variants and the sharded ones (optimizer state, FSDP) on two Gloo
# ranks, precision experiments, profiles,
# and a memory sweep with checkpointing; then the report of exactly those runs.
demo: $(STAMP)
	$(VENV)/bin/cs336sys model --db $(DEMO_DB) --size tiny --context-length 64,128 \
		--batch-size 4 --mode forward,train --precision fp32,bf16 --warmup 2 --steps 5
	$(VENV)/bin/cs336sys attention --db $(DEMO_DB) --impl naive,sdpa,flash-torch \
		--seq 128,256,512 --d-head 32,64 --batch 4 --warmup 2 --iters 10
	TRITON_INTERPRET=1 $(VENV)/bin/cs336sys attention --db $(DEMO_DB) --impl triton \
		--device cpu --seq 64 --d-head 32 --batch 1 --warmup 1 --iters 2
	$(VENV)/bin/cs336sys comm --db $(DEMO_DB) --op all-reduce,all-gather,reduce-scatter,broadcast \
		--size 1MB,10MB --world-size 2 --warmup 2 --iters 10
	$(VENV)/bin/cs336sys ddp --db $(DEMO_DB) --world-size 2 --context-length 64 \
		--bucket-mb 1,10,100 --warmup 1 --steps 3
	$(VENV)/bin/cs336sys ddp --db $(DEMO_DB) --world-size 2 --context-length 64 \
		--impl torch,fsdp,torch-fsdp --shard-optimizer --zero --warmup 1 --steps 3
	$(VENV)/bin/cs336sys memory --db $(DEMO_DB) --size tiny --context-length 256 \
		--batch-size 4 --mode forward,train --checkpoint none,every:1,sqrt --warmup 1 --steps 2
	$(VENV)/bin/cs336sys memory --db $(DEMO_DB) --size tiny --context-length 256 \
		--batch-size 4 --mode train --warmup 1 --steps 1 --snapshot $(DEMO_REPORT)/snapshots
	$(VENV)/bin/cs336sys memory residuals --db $(DEMO_DB) --size tiny --context-length 128 \
		--impl eager,compiled
	$(VENV)/bin/cs336sys precision accumulate --db $(DEMO_DB)
	$(VENV)/bin/cs336sys precision autocast --db $(DEMO_DB) --dtype bf16,fp16
	$(VENV)/bin/cs336sys profile model --db $(DEMO_DB) --size tiny --context-length 64 \
		--batch-size 4 --warmup 2 --steps 3 --top 8
	$(VENV)/bin/cs336sys profile attention --db $(DEMO_DB) --impl naive,sdpa --seq 256 \
		--d-head 64 --batch 4 --heads 4 --warmup 2 --iters 5 --top 5
	$(VENV)/bin/cs336sys sql --db $(DEMO_DB) \
		"SELECT size, context_length AS ctx, mode, precision, status, \
		        round(fwd_ms_mean, 1) AS fwd_ms, round(bwd_ms_mean, 1) AS bwd_ms, \
		        round(opt_ms_mean, 1) AS opt_ms, round(step_ms_mean, 1) AS step_ms, \
		        round(tokens_per_s) AS tokens_per_s, round(tflops, 4) AS tflops \
		   FROM model_runs \
		  WHERE invocation_id = (SELECT id FROM invocations WHERE command = 'model' \
		                          ORDER BY started DESC LIMIT 1) \
		  ORDER BY created"
	$(VENV)/bin/cs336sys report --db $(DEMO_DB) --since $(DEMO_START) --out $(DEMO_REPORT) \
		--title "cs336sys demo (CPU-sized sweeps)"

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

# On a GPU host where torch and Triton are installed and nothing can be downloaded (README,
# "On a GPU"): the checkout runs as it is, with the system's Python, and sqlite-utils and the
# two packages it needs that such hosts lack arrive as wheels in $(WHEELS), made beforehand by
# `make wheels` on a machine that reaches the registry.
GPU_PYTHON ?= python3
WHEELS ?= .whl
GPU_SITE ?= /tmp/cs336sys-site
GPU_WHEELS := sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4

gpu-check:
	@if ls $(WHEELS)/*.whl >/dev/null 2>&1; then \
		$(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --upgrade --root-user-action=ignore \
			--target $(GPU_SITE) $(WHEELS)/*.whl; \
	fi
	@PYTHONPATH=$(CURDIR):$(GPU_SITE) $(GPU_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

wheels: $(STAMP)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d $(WHEELS) \
		$(GPU_WHEELS)

clean-venv:
	rm -rf $(VENV)
