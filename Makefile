# Both entry points create (or reuse) .venv and install the pinned set first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= data/halfcheetah_random_demo
MEDIUM_DIR ?= data/halfcheetah_v5_medium
MEDIUM_EPISODES ?= 1000

.PHONY: install demo test bench offline-suite offline-table medium d4rl-datasets figures

install: $(STAMP)

$(STAMP): setup.py constraints.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (or run: make PYTHON=python3 ...)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	# One resolve, tf-agents included (setup.py says which pins make that possible).
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	$(PY) -m pip check
	$(PY) -c "import tf_agents, reverb, rlds, tensorflow_datasets, gymnasium, gymnasium_robotics" 2>/dev/null
	touch $(STAMP)

demo: $(STAMP)
	test -f $(DEMO_DIR)/.complete || $(PY) -m pipelines.generate --env HalfCheetah-v5 --policy random --episodes 20 --out $(DEMO_DIR)
	$(PY) -m pipelines.push --dataset $(DEMO_DIR)
	$(PY) -m pipelines.train --agent td3_bc --dataset $(DEMO_DIR) --steps 2000 --eval_interval 1000 --eval_episodes 2 --root_dir runs/demo_td3_bc

test: $(STAMP)
	$(PY) -m pytest -n 2 --timeout 900 --durations 40 tests

bench: $(STAMP)
	$(PY) bench/feed.py
	$(PY) bench/push.py
	$(PY) bench/sample.py

# The D4RL-style medium dataset, recorded with the shipped medium policy.
medium: $(STAMP)
	test -f $(MEDIUM_DIR)/.complete || $(PY) -m pipelines.generate --env HalfCheetah-v5 --policy medium --episodes $(MEDIUM_EPISODES) --seed 0 --out $(MEDIUM_DIR)

# All four D4RL-style datasets from the shipped policies (docs/datasets.md):
# HalfCheetah-v5 as 1,000 episodes of 1,000 steps; the envs that terminate
# (Hopper-v5, Walker2d-v5) as 1M transitions of whole episodes, as D4RL sizes
# them, in TFDS's d4rl_mujoco_* encoding.
TERMINATING_ENVS ?= Hopper-v5 Walker2d-v5
GENERATE_D4RL = $(PY) -m pipelines.generate --seed 0 --encoding tfds_d4rl
d4rl-datasets: medium
	test -f data/halfcheetah_v5_medium_replay/.complete || $(PY) -m pipelines.generate --env HalfCheetah-v5 --dataset-kind medium-replay --seed 0 --out data/halfcheetah_v5_medium_replay
	test -f data/halfcheetah_v5_expert/.complete || $(PY) -m pipelines.generate --env HalfCheetah-v5 --policy expert --episodes 1000 --seed 0 --out data/halfcheetah_v5_expert
	test -f data/halfcheetah_v5_medium_expert/.complete || $(PY) -m pipelines.generate --env HalfCheetah-v5 --dataset-kind medium-expert --episodes 1000 --seed 0 --out data/halfcheetah_v5_medium_expert
	set -e; for env in $(TERMINATING_ENVS); do \
	  d=data/$$(echo $$env | tr 'A-Z-' 'a-z_'); \
	  test -f $${d}_medium/.complete || $(GENERATE_D4RL) --env $$env --policy medium --env_steps 1000000 --out $${d}_medium; \
	  test -f $${d}_medium_replay/.complete || $(GENERATE_D4RL) --env $$env --dataset-kind medium-replay --out $${d}_medium_replay; \
	  test -f $${d}_expert/.complete || $(GENERATE_D4RL) --env $$env --policy expert --env_steps 1000000 --out $${d}_expert; \
	  test -f $${d}_medium_expert/.complete || $(GENERATE_D4RL) --env $$env --dataset-kind medium-expert --env_steps 1000000 --out $${d}_medium_expert; \
	done

offline-suite: medium
	$(PY) -m tools.offline_suite --dataset $(MEDIUM_DIR)

# docs/results/offline.json and its table, made again from the committed
# bench lines and long runs (tools/offline_table.py's PUBLISHED_LINES).
offline-table: $(STAMP)
	$(PY) -m tools.offline_table --published > docs/results/offline.json
	$(PY) -m tools.offline_table --published --markdown

figures: $(STAMP)
	$(PY) images/rlds/draw_figures.py
