# Two commands for readers and CI: `make book` and `make test`. Both set up .venv on demand.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Which PyTorch build to install, for the version pinned in constraints.txt:
#   (empty, the default) whatever pip finds for that version: the CPU wheel where one lies in
#       pip's find-links (the reference machine), otherwise PyPI's wheel, which on Linux is the
#       CUDA build, GPU or not (macOS and Windows wheels on PyPI have no CUDA anyway);
#   TORCH=cpu  PyTorch's CPU-only build from its own index, for a Linux laptop without an NVIDIA
#       GPU: PyPI's Linux wheel is the CUDA build and pulls several GB of CUDA libraries.
#       `make test TORCH=cpu` (or `make book TORCH=cpu`, `make setup TORCH=cpu`); an existing
#       .venv then switches to that build.
TORCH ?=
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_VERSION := $(shell sed -n 's/^torch==//p' constraints.txt)
#   TORCH=cu126 (any cuXYZ PyTorch publishes for that version) that CUDA build from PyTorch's own
#       index: PyPI's Linux wheel is a CUDA 13 build, which needs an NVIDIA driver >= 580; on an
#       older driver torch sees no GPU and the book runs on the CPU. `make doctor` and
#       `make gpu-check` say when this is the case and which build to take. (PyTorch's index is not
#       reachable from the reference machine: this line is not exercised by its tests.)
ifeq ($(TORCH),)
TORCH_REQUIREMENT := "torch"
else ifeq ($(TORCH),cpu)
# `==X+cpu`, not `==X`: an installed CUDA build of X would satisfy `==X` and stay.
TORCH_REQUIREMENT := --index-url $(TORCH_CPU_INDEX) "torch==$(TORCH_VERSION)+cpu"
else ifneq ($(shell echo '$(TORCH)' | grep -E '^cu[0-9]{3}$$'),)
TORCH_REQUIREMENT := --index-url https://download.pytorch.org/whl/$(TORCH) "torch==$(TORCH_VERSION)+$(TORCH)"
else
$(error TORCH=$(TORCH): giá trị không hợp lệ; để trống (mặc định), TORCH=cpu, hoặc một bản CUDA như TORCH=cu126)
endif
STAMP := $(VENV)/.dpbook-installed$(if $(TORCH),-$(TORCH))
export PATH := $(CURDIR)/$(BIN):$(PATH)
# 2 workers suit the 2-core reference machine; override with `make test JOBS=8`.
JOBS ?= 2

.PHONY: book pdf test lab gpu-check doctor setup clean browser bench-launch

setup: $(STAMP)

# torch first, pinned by constraints.txt (and built as TORCH says, above): on a CPU-only machine
# pip finds the local CPU wheel, on a GPU box PyPI's CUDA build of the same version; a `+cpu`
# build satisfies the pin too (a local version label is ignored). Installing the package afterwards under
# the same constraint keeps pip from replacing torch with another build. --no-compile, then
# compileall on every core: pip byte-compiles one file at a time, which took about half the
# set-up on 2 cores. The byte-code must be written here: where PYTHONDONTWRITEBYTECODE is set (as
# on this project's machines), Python never caches it, and every rank and kernel would compile torch again.
# The libraries' own test suites (folders test/ and tests/: numpy's, sympy's, networkx's…) are
# never imported here and are left out: 42 s instead of 77 s on 2 cores.
# compileall's status is ignored: a few files written for newer Pythons (torch's py312 tests) do not
# compile on 3.11, and nothing imports them.
# The package and its ~150 dependencies go in with uv (pinned in constraints.txt, from PyPI), which
# downloads and unpacks them in parallel: 3 s instead of pip's 25 s on 2 cores. torch is already
# there and satisfies the constraint, so uv leaves it as pip installed it. Where uv cannot be
# installed, pip does it.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Cài đặt môi trường vào $(VENV) (log: $(VENV)/install.log)…"
	@{ $(BIN)/python -m pip install --no-compile -c constraints.txt $(TORCH_REQUIREMENT) \
	   && { { $(BIN)/python -m pip install -c constraints.txt uv \
	          && $(BIN)/uv pip install --python $(BIN)/python -c constraints.txt -e . ; } \
	        || $(BIN)/python -m pip install --no-compile -c constraints.txt -e . ; } \
	   && { $(BIN)/python -m compileall -q -j 0 -x '/tests?/' $(VENV)/lib code || true; } ; } > $(VENV)/install.log 2>&1 \
	   || { tail -n 40 $(VENV)/install.log; exit 1; }
	@touch $@

book: $(STAMP)
	$(BIN)/jupyter-book build . -W --keep-going
	@echo "Sách HTML: $(CURDIR)/_build/html/index.html"

# The whole book as one PDF (with the solutions) and a student edition without them, in _build/pdf:
# a one-page build from the same execution cache, printed by Debian's Chromium (dpbook.tools.pdf).
pdf: $(STAMP) browser
	$(BIN)/python -m dpbook.tools.pdf

# For learners: JupyterLab from the book's own .venv (its kernel imports dpbook, ipywidgets' live
# controls work), opened at the chapter's first page (the server's default address, so the address it
# prints opens that page too). A remote GPU box: `make lab LAB_ARGS="--no-browser
# --ip=127.0.0.1 --port=8888"` there, then `ssh -L 8888:127.0.0.1:8888 box` and the printed address.
LAB_PAGE := book/ch04/p1/01-nen-tang-toan-hoc.ipynb
LAB_ARGS ?=
# As root (a container, a cloud notebook) Jupyter refuses to start without --allow-root.
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/$(LAB_PAGE) \
	  $(LAB_ROOT) $(LAB_ARGS)

# The browser tests drive Debian's Chromium through Playwright (Playwright cannot download its
# own browser here). As root on Debian it is installed on demand; elsewhere the tests say why
# they are skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Cài Chromium (gói Debian) cho kiểm thử trình duyệt…"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
	      > $(VENV)/apt.log 2>&1 || { tail -n 20 $(VENV)/apt.log; exit 1; }; \
	  else echo "Không có Chromium và không cài được: các kiểm thử trình duyệt sẽ bị bỏ qua."; fi; }

# Two runs: first every test and every notebook (nbval), whose runs fill the book's execution
# cache (dpbook.tools.nbval_cache); then the whole-book build and the browser tests, which use
# that cache instead of executing every notebook a second time; its workers share one build
# (the `built` fixture) and the PDF's print, the longest test, is handed out first.
# The slowest files first (pytest collects in the order given and drops the repeats): xdist hands
# out files as workers free up, and a minute-long file handed out last kept one worker busy
# alone at the end.
SLOW_FIRST := tests/scripts/test_resume.py tests/scripts/test_commands.py tests/labs/test_mutants.py
test: $(STAMP) browser
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile --nbval-lax -m "not builds_book" --durations=10 \
	  $(SLOW_FIRST) tests book
	$(BIN)/python -m pytest -n $(JOBS) --dist load -m builds_book --durations=5 \
	  tests/test_built_book_print.py tests/test_built_book.py

# Not part of `make test`: the launcher's speed against torch.multiprocessing.spawn, 200
# launches in 2 concurrent streams (must print 0 failures), and the gloo race the launcher avoids.
bench-launch: $(STAMP)
	$(BIN)/python benchmarks/launch_speed.py
	$(BIN)/python benchmarks/launch_stress.py
	$(BIN)/python benchmarks/gloo_init_race.py

gpu-check: $(STAMP)
	$(BIN)/python -m dpbook.tools.gpu_check

# What this machine can run and which mode each part of the book takes here (no GPU needed).
doctor: $(STAMP)
	$(BIN)/python -m dpbook.doctor

clean:
	rm -rf _build .pytest_cache
