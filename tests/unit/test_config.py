import re
from pathlib import Path

import pytest
import yaml

from relayrl.config import (
    ConfigError,
    HfModel,
    PretrainedModel,
    RunConfig,
    TinyModel,
    TorchEngineConfig,
    VllmEngineConfig,
    load_run_config,
)
from relayrl.config.base import apply_overrides

ROOT = Path(__file__).resolve().parents[2]
# not under hidden folders: bench/.venv (made by the benches) holds other packages' YAML
YAMLS = sorted({p for d in ("examples", "deploy", "bench", ".") for ext in ("yaml", "yml")
                for p in ROOT.glob(f"{d}/**/*.{ext}" if d != "." else f"*.{ext}")
                if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)})


def yaml_docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def run_configs(path: Path) -> list[tuple[str, dict]]:
    """The run configs a shipped YAML file holds: the file itself, or those a Kubernetes
    ConfigMap carries (as data values that name a run_id)."""
    out = []
    for doc in yaml_docs(path):
        if "run_id" in doc and "kind" not in doc:
            out.append((str(path.relative_to(ROOT)), doc))
        if doc.get("kind") == "ConfigMap":
            for key, text in (doc.get("data") or {}).items():
                data = yaml.safe_load(text)
                if isinstance(data, dict) and "run_id" in data:
                    out.append((f"{path.relative_to(ROOT)}:{key}", data))
    return out


SHIPPED = [pair for p in YAMLS for pair in run_configs(p)]


def test_there_are_shipped_configs():
    assert any(name.startswith("examples/") for name, _ in SHIPPED)
    assert any(name.startswith("deploy/k8s/") for name, _ in SHIPPED)


@pytest.mark.parametrize("name,data", SHIPPED, ids=[name for name, _ in SHIPPED])
def test_every_shipped_config_loads(tmp_path, name, data):
    """Every shipped config loads, and hands each service its part."""
    cfg = load_run_config(write(tmp_path, data))
    for service in ("trainer_svc", "scheduler_svc", "buffer_svc", "relay_svc", "eval_svc",
                    "rollout_svc"):
        assert cfg.part(service).run_id == cfg.run_id


def test_every_shipped_yaml_is_checked():
    """Every YAML under examples/, deploy/ and bench/ (and at the root) is a run config
    loaded above, a Kubernetes manifest or compose file (test_deploy), the simulator's
    config (test_sim), or the docs site's (test_docs_build): a file none of them reads
    could rot unseen."""
    from relayrl_sim import config_from_mapping

    for path in YAMLS:
        if path.name == "mkdocs.yml":
            continue
        docs = yaml_docs(path)
        if run_configs(path) or all("kind" in d for d in docs) or "services" in docs[0]:
            continue
        assert "sim" in docs[0], f"{path.relative_to(ROOT)} is checked by no test"
        config_from_mapping(docs[0])


def write(tmp_path, data):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("data,field", [
    ({"trainer": {"optimizer": {"lr": -1}}}, "trainer.optimizer.lr"),
    ({"trainer": {"max_steps": "many"}}, "trainer.max_steps"),
    ({"rollout": {"temperature": 0}}, "rollout.temperature"),
    ({"rollout": {"samples_per_prompt": 3}},
     "rollout.samples_per_prompt is now buffer.group_size, declared once"),
    ({"bench": {"synthetic_length_p99_ratio": 0.5}}, "bench.synthetic_length_p99_ratio"),
    ({"restarts": {"worker_max_restarts": -1}}, "restarts.worker_max_restarts"),
    ({"trainer": {"bogus": 1}}, "trainer.bogus"),
    ({"relay": {"endpoint": {"port": 70000}}}, "relay.endpoint.port"),
    ({"scheduler": {"endpoint": {"port": 50551}}}, "port 50551"),
    ({"buffer": {"metrics_port": 50554}}, "buffer.metrics_port and trainer.endpoint.port"),
    ({"relay": {"metrics_port": 9100}, "rollout": {"metrics_base_port": 9099}},
     r"rollout worker 1 metrics \(rollout.metrics_base_port\+1\) and relay.metrics_port"),
    ({"run_id": "has space"}, "run_id"),
    ({"task": {"name": "addition"}}, "task.name 'addition': the task is now picked by task.source"),
    ({"task": {"source": "chess"}}, "task: Input tag 'chess' found using 'source'"),
    ({"task": {"prompt_format": "chat"}}, "task.prompt_format"),
    ({"model": {"kind": "pretrained", "name": "gpt-5"}},
     r"model.name \(pretrained\): Input should be 'smollm2-135m-instruct'"),
    ({"model": {"kind": "hf"}}, r"model.path \(hf\): Field required"),
    ({"model": {"kind": "tiny", "num_heads": 0}}, r"model.num_heads \(tiny\)"),
    ({"rollout": {"engine": {"kind": "vllm", "dtype": "int4"}}},
     r"rollout.engine.dtype \(vllm\)"),
    ({"rollout": {"engine": "vllm"}, "model": {"hidden_size": 64, "num_heads": 4}},
     "rollout.engine.kind vllm cannot run the tiny model's head size 16"),
])
def test_bad_configs_name_the_field(tmp_path, data, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_run_config(write(tmp_path, data))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(tmp_path / "nope.yaml")


def test_overrides_apply_and_validate(tmp_path):
    cfg = load_run_config(write(tmp_path, {}), ["trainer.optimizer.lr=0.01",
                                                "rollout.num_workers=3"])
    assert cfg.trainer.optimizer.lr == 0.01 and cfg.rollout.num_workers == 3
    with pytest.raises(ConfigError, match="trainer.optimizer.lr"):
        load_run_config(write(tmp_path, {}), ["trainer.optimizer.lr=-3"])
    with pytest.raises(ConfigError, match="section.field=value"):
        apply_overrides({}, ["no_equals_sign"])


# each run-level rule (a RunConfig model validator), a config that breaks it alone, and
# what its message says
CROSS_CHECKS = {
    "_lora_rank_fits_vllm": (
        {"trainer": {"lora": {"rank": 1024}}, "rollout": {"engine": {"kind": "vllm"}},
         "model": {"hidden_size": 128, "num_heads": 4}},
        "trainer.lora.rank: 1024 is above 512, the largest rank the vllm engine serves"),
    "_task_rewards_inside_the_buffers": (
        {"task": {"reward_range": [0, 20]}, "buffer": {"reward_range": [-10, 10]}},
        r"task.reward_range \[0, 20\] must lie inside buffer.reward_range \[-10, 10\]"),
    "_weight_plane_is_served": (
        {"rollout": {"weight_plane": "shm"}}, "rollout.weight_plane 'shm' is not in "
        r"relay.data_planes \['grpc', 'torch_dist'\]"),
    "_tiny_model_knows_only_addition": (
        {"task": {"prompt_format": "chat"}},
        "task.prompt_format 'chat' needs model.kind hf or pretrained"),
    "_vllm_supports_the_tiny_head_size": (
        {"rollout": {"engine": "vllm"}, "model": {"hidden_size": 64, "num_heads": 4}},
        "head size 16 "),
    "_engine_window_holds_a_response": (
        {"rollout": {"max_new_tokens": 64, "engine": {"kind": "vllm", "max_model_len": 64}}},
        r"rollout.engine.max_model_len \(64\) must exceed rollout.max_new_tokens \(64\)"),
    "_repack_needs_segments": (
        {"scheduler": {"repack": True}}, "scheduler.repack needs rollout.segment_tokens > 0"),
    "_verifiers_tasks_play_in_their_adapter": (
        {"task": {"source": "verifiers", "env_id": "my_env"}, "model": {"kind": "pretrained"},
         "rollout": {"segment_tokens": 0, "environment": {"cls": "calculator"}}},
        "rollout.environment.cls 'calculator': task.source verifiers plays its episodes in "
        "the 'verifiers' adapter"),
    "_environments_run_whole_episodes": (
        {"rollout": {"segment_tokens": 4, "environment": {"cls": "calculator"}}},
        "rollout.environment needs rollout.segment_tokens 0"),
    "_pending_samples_hold_a_batch": (
        {"buffer": {"max_pending_samples": 8}},
        r"buffer.max_pending_samples \(8\) must hold at least one batch, groups_per_batch x "
        r"group_size \(64\)"),
    "_redis_timeout_outlasts_a_blocking_read": (
        {"redis": {"socket_timeout_s": 1.0}, "buffer": {"read_block_ms": 2000}},
        r"redis.socket_timeout_s \(1\) must exceed buffer.read_block_ms \(2000\)"),
    "_publish_plane_is_served": (
        {"trainer": {"publish_plane": "shm"}},
        r"trainer.publish_plane 'shm' needs 'shm' in relay.data_planes \(now \['grpc', "
        r"'torch_dist'\]\) and relay.shm_dir"),
    "_shm_plane_has_a_directory": (
        {"relay": {"data_planes": ["grpc", "shm"], "shm_dir": ""}},
        "relay.data_planes has 'shm' but relay.shm_dir is unset"),
    "_overlong_buffer_fits_the_length_cap": (
        {"trainer": {"loss": {"overlong_buffer": 9}}},
        r"trainer.loss.overlong_buffer \(9\) must be at most rollout.max_new_tokens \(8\)"),
    "_ports_are_distinct": (
        {"buffer": {"metrics_port": 50554}},
        "buffer.metrics_port and trainer.endpoint.port both use port 50554"),
    "_relay_rendezvous_is_dialable": (
        {"relay": {"endpoint": {"host": "0.0.0.0", "port": 50551}}},
        r"relay.endpoint.host '0.0.0.0' is no address a worker can dial, and "
        r"relay.data_planes \['torch_dist'\] hand it to workers"),
    "_placed_workers_are_the_workers": (
        {"resources": {"nodes": [{"gpus": 8}], "rollout": [{"gpus": [1, 2, 3]}]}},
        r"resources.rollout places 3 worker\(s\) of 1 GPU\(s\), and rollout.num_workers is "
        "2"),
    "_nccl_pairs_are_on_two_gpus": (
        {"resources": {"nodes": [{"gpus": 2}], "relay": {"gpus": [1]},
                       "rollout": [{"gpus": [0, 1]}]},
         "relay": {"data_planes": ["grpc", "nccl"]}, "rollout": {"weight_plane": "nccl"}},
        "resources.relay and rollout worker 1 are both on GPU 1 of node 0, and NCCL refuses "
        "two ranks on one GPU"),
    "_vllm_plane_carries_whole_models_to_vllm": (
        {"relay": {"data_planes": ["grpc", "vllm"]}, "rollout": {"weight_plane": "vllm"}},
        "rollout.weight_plane vllm moves versions into vLLM's own engine: it needs "
        "rollout.engine.kind vllm"),
    "_nodes_can_reach_each_other": (
        {"resources": {"nodes": [{"address": "10.0.0.1"}, {"address": "10.0.0.2"}]},
         "redis": {"url": "redis://10.0.0.1:6379"}},
        r"relay.endpoint.host '127.0.0.1' cannot be dialled from the run's other nodes: set "
        r"it to node 0's address, '10.0.0.1' \(resources.relay.node\)"),
    "_plaintext_stays_on_loopback": (
        {"scheduler": {"rest_port": 8080, "rest_host": "0.0.0.0"}},
        r"scheduler.rest_host '0.0.0.0' is beyond loopback and auth.tls is unset: .* set "
        r"auth.tls \(cert, key, ca\), or auth.plaintext_beyond_loopback: true"),
}


def test_every_cross_check_is_one_documented_rule():
    validators = {name: d for name, d in RunConfig.__pydantic_decorators__.model_validators
                  .items() if d.info.mode == "after"}
    assert set(validators) == set(CROSS_CHECKS)
    for name, decorator in validators.items():
        assert decorator.func.__doc__, name


@pytest.mark.parametrize("rule", sorted(CROSS_CHECKS))
def test_each_cross_check_names_fields_values_and_limit(tmp_path, rule):
    data, message = CROSS_CHECKS[rule]
    with pytest.raises(ConfigError, match=message):
        load_run_config(write(tmp_path, data))


@pytest.mark.parametrize("data,message", [
    ({"task": {"source": "reasoning_gym", "generator": "chain_sum"}},
     "task.source 'reasoning_gym' needs model.kind hf or pretrained"),
    ({"eval": {"sets": [{"name": "rg", "task": {"source": "reasoning_gym",
                                                 "generator": "chain_sum"}}]}},
     "eval.sets 'rg': task.source 'reasoning_gym' needs model.kind hf or pretrained"),
])
def test_the_tiny_model_runs_raw_addition_only(tmp_path, data, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(write(tmp_path, data))
    for model in ({"kind": "pretrained"}, {"kind": "hf", "path": "/models/m"}):
        load_run_config(write(tmp_path, {**data, "model": model}))


def test_the_model_is_the_tiny_one_unless_a_kind_says_otherwise(tmp_path):
    assert isinstance(RunConfig().model, TinyModel)
    cfg = load_run_config(write(tmp_path, {"model": {"hidden_size": 64}}))
    assert isinstance(cfg.model, TinyModel) and cfg.model.hidden_size == 64
    assert (cfg.model.limits().vocab_size, cfg.model.limits().context_length) == (15, 256)
    cfg = load_run_config(write(tmp_path, {"model": {"kind": "hf", "path": "/models/m"}}))
    assert isinstance(cfg.model, HfModel) and cfg.model.path == "/models/m"
    cfg = load_run_config(write(tmp_path, {"model": {"kind": "pretrained",
                                                     "cache_dir": str(tmp_path)}}))
    assert isinstance(cfg.model, PretrainedModel)
    assert cfg.model.converted_dir == tmp_path / "smollm2-135m-instruct"


def test_an_hf_models_limits_come_from_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text('{"vocab_size": 100, "n_positions": 512}')
    limits = HfModel(path=str(tmp_path)).limits()
    assert (limits.vocab_size, limits.context_length) == (100, 512)


def test_the_engine_is_torch_unless_a_kind_says_otherwise(tmp_path):
    cfg = load_run_config(write(tmp_path, {}))
    assert isinstance(cfg.rollout.engine, TorchEngineConfig)
    assert cfg.rollout.weight_device == "auto" and cfg.rollout.kv_transfer_base_port == 0
    cfg = load_run_config(write(tmp_path, {"rollout": {"engine": {"device": "cpu"}}}))
    assert cfg.rollout.engine.device == "cpu" and cfg.rollout.weight_device == "cpu"
    cfg = load_run_config(write(tmp_path, {"rollout": {"engine": {
        "kind": "vllm", "dtype": "bfloat16", "kv_transfer_base_port": 5600}}}))
    assert isinstance(cfg.rollout.engine, VllmEngineConfig)
    assert cfg.rollout.engine.dtype == "bfloat16" and cfg.rollout.kv_transfer_base_port == 5600
    assert cfg.rollout.with_engine("vllm") is cfg.rollout
    assert isinstance(cfg.rollout.with_engine("torch").engine, TorchEngineConfig)
    cfg = load_run_config(write(tmp_path, {}), ["rollout.engine=vllm"])  # shorthand
    assert isinstance(cfg.rollout.engine, VllmEngineConfig)


def test_trainer_optimizer_and_checkpoint_are_nested(tmp_path):
    cfg = load_run_config(write(tmp_path, {"trainer": {
        "optimizer": {"lr": 0.01, "weight_decay": 0.1, "grad_clip": 2.0},
        "checkpoint": {"every": 5, "keep": 3}}}))
    assert (cfg.trainer.optimizer.lr, cfg.trainer.optimizer.weight_decay,
            cfg.trainer.optimizer.grad_clip) == (0.01, 0.1, 2.0)
    assert (cfg.trainer.checkpoint.every, cfg.trainer.checkpoint.keep) == (5, 3)


# an old key, the value it is given, and the message naming its new place
MOVED_KEYS = [
    ("model.path", "/m", "model.path is now model.path with model.kind: hf"),
    ("model.pretrained", "smollm2-135m-instruct",
     "model.pretrained is now model.name with model.kind: pretrained"),
    ("rollout.vllm_dtype", "bfloat16",
     "rollout.vllm_dtype is now rollout.engine.dtype with rollout.engine.kind: vllm"),
    ("rollout.vllm_kv_cache_gib", 2,
     "rollout.vllm_kv_cache_gib is now rollout.engine.kv_cache_gib with "
     "rollout.engine.kind: vllm"),
    ("rollout.kv_transfer_base_port", 5600, "rollout.kv_transfer_base_port is now "
     "rollout.engine.kv_transfer_base_port with rollout.engine.kind: vllm"),
    ("rollout.kv_cache_tokens", 0,
     "rollout.kv_cache_tokens is now rollout.engine.kv_cache_tokens with "
     "rollout.engine.kind: torch"),
    ("rollout.device", "cpu",
     "rollout.device is now rollout.engine.device with rollout.engine.kind: torch"),
    ("trainer.lr", 0.1, "trainer.lr is now trainer.optimizer.lr"),
    ("trainer.grad_clip", 2.0, "trainer.grad_clip is now trainer.optimizer.grad_clip"),
    ("trainer.weight_decay", 0.1, "trainer.weight_decay is now trainer.optimizer.weight_decay"),
    ("trainer.checkpoint_every", 5, "trainer.checkpoint_every is now trainer.checkpoint.every"),
    ("trainer.keep_checkpoints", 3, "trainer.keep_checkpoints is now trainer.checkpoint.keep"),
]


@pytest.mark.parametrize("key,value,message", MOVED_KEYS, ids=[k for k, _, _ in MOVED_KEYS])
def test_an_old_key_is_refused_naming_its_new_place(tmp_path, key, value, message):
    section, field = key.split(".")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_run_config(write(tmp_path, {section: {field: value}}))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_run_config(write(tmp_path, {}), [f"{key}={value}"])


def test_every_old_key_of_a_config_is_refused_in_one_error(tmp_path):
    """A config written for the previous schema is told everything it must change by one
    load: each old key, in whichever section and however many share one, is a line of the
    same ConfigError naming its new place, beside the section's other errors."""
    data = {"model": {"path": "/m"},
            "rollout": {"vllm_dtype": "bfloat16", "device": "cpu"},
            "trainer": {"lr": 0.1, "clip_eps": 0.3, "eval_every": 5, "bogus": 1}}
    with pytest.raises(ConfigError) as err:
        load_run_config(write(tmp_path, data))
    lines = dict(line.strip().split(": ", 1) for line in str(err.value).splitlines()[1:])
    assert {k: v.split(",")[0] for k, v in lines.items()} == {
        "model.path (tiny)": "model.path is now model.path with model.kind: hf",
        "rollout.vllm_dtype": "rollout.vllm_dtype is now rollout.engine.dtype with "
                              "rollout.engine.kind: vllm",
        "rollout.device": "rollout.device is now rollout.engine.device with "
                          "rollout.engine.kind: torch",
        "trainer.lr": "trainer.lr is now trainer.optimizer.lr",
        "trainer.clip_eps": "trainer.clip_eps moved into the loss recipe: set "
                            "trainer.loss.clip_eps",
        "trainer.eval_every": "trainer.eval_every is now eval.every",
        "trainer.bogus": "Extra inputs are not permitted"}


def test_launcher_and_benchmark_keys_of_the_rollout_are_refused_in_one_error(tmp_path):
    """rollout.max_restarts and the synthetic lengths left the rollout section: each is a
    line of one error naming its new place, in restarts or bench."""
    data = {"rollout": {"max_restarts": 5, "synthetic_length_median": 16,
                        "synthetic_length_p99_ratio": 10.0}}
    with pytest.raises(ConfigError) as err:
        load_run_config(write(tmp_path, data))
    message = str(err.value)
    for line in (
            "rollout.max_restarts: rollout.max_restarts is now restarts.worker_max_restarts "
            "(a launcher setting), as in `restarts: {worker_max_restarts: 5}`",
            "rollout.synthetic_length_median: rollout.synthetic_length_median is now "
            "bench.synthetic_length_median (a benchmark setting), as in `bench: "
            "{synthetic_length_median: 16}`",
            "rollout.synthetic_length_p99_ratio: rollout.synthetic_length_p99_ratio is now "
            "bench.synthetic_length_p99_ratio (a benchmark setting), as in `bench: "
            "{synthetic_length_p99_ratio: 10.0}`"):
        assert f"\n  {line}" in message, message
    cfg = load_run_config(write(tmp_path, {
        "restarts": {"worker_max_restarts": 5},
        "bench": {"synthetic_length_median": 16, "synthetic_length_p99_ratio": 10.0}}))
    assert cfg.restarts.worker_max_restarts == 5
    assert (cfg.bench.synthetic_length_median, cfg.bench.synthetic_length_p99_ratio) == (16, 10.0)


def test_every_field_of_another_kind_is_refused_in_one_error(tmp_path):
    """Fields left behind by a change of kind are each named, with the kinds that have
    them, in one error."""
    data = {"model": {"kind": "hf", "path": "/m", "hidden_size": 64, "num_heads": 4},
            "trainer": {"loss": {"name": "dapo", "clip_eps": 0.1, "gamma": 0.9}}}
    with pytest.raises(ConfigError) as err:
        load_run_config(write(tmp_path, data))
    message = str(err.value)
    for line in (
            "model.hidden_size (hf): 'hidden_size' is not a field of model 'hf' (a field of "
            "tiny)",
            "model.num_heads (hf): 'num_heads' is not a field of model 'hf' (a field of tiny)",
            "trainer.loss.clip_eps (dapo): 'clip_eps' is not a field of loss 'dapo' (a field "
            "of grpo",
            "trainer.loss.gamma (dapo): 'gamma' is not a field of loss 'dapo' (a field of "
            "ppo)"):
        assert f"\n  {line}" in message, message


@pytest.mark.parametrize("data,message", [
    ({"model": {"kind": "gguf"}}, "Input tag 'gguf' found using 'kind'"),
    ({"rollout": {"engine": {"kind": "sglang"}}}, "Input tag 'sglang' found using 'kind'"),
    ({"model": {"kind": "hf", "path": "/m", "hidden_size": 64}},
     "'hidden_size' is not a field of model 'hf' (a field of tiny)"),
    ({"model": {"kind": "pretrained", "path": "/m"}},
     "model.path is now model.path with model.kind: hf"),
    ({"rollout": {"engine": {"kind": "vllm", "device": "cpu"}}},
     "'device' is not a field of engine 'vllm' (a field of torch)"),
    ({"rollout": {"engine": {"kind": "torch", "dtype": "bfloat16"}}},
     "'dtype' is not a field of engine 'torch' (a field of vllm)"),
])
def test_a_wrong_kind_or_a_field_of_another_kind_is_refused(tmp_path, data, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_run_config(write(tmp_path, data))


@pytest.mark.parametrize("staleness,batches", [(0, 1), (1, 2), (2, 2), (3, 3), (8, 8)])
def test_inflight_limit_follows_batch_and_staleness(staleness, batches):
    """One batch out at staleness 0 (synchronous), two at least with any staleness (so
    generation overlaps training), else as many as the bound."""
    cfg = RunConfig.model_validate({"buffer": {"groups_per_batch": 4},
                                    "trainer": {"max_staleness": staleness}})
    assert cfg.inflight_limit == 4 * batches


@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n"])
def test_a_config_file_without_settings_is_refused(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="holds no settings .*empty or only comments"):
        load_run_config(path)
    path.write_text("{}\n")  # asked for: every default
    assert load_run_config(path).task.source == "addition"


def test_the_prompt_window_is_the_engine_window_less_the_response():
    own = {"model": {"kind": "pretrained"}, "rollout": {"max_new_tokens": 48}}
    window = RunConfig.model_validate(own).prompt_window()
    assert (window.engine, window.longest) == (8192, 8144)
    vllm = {**own, "rollout": {"max_new_tokens": 48,
                               "engine": {"kind": "vllm", "max_model_len": 512}}}
    window = RunConfig.model_validate(vllm).prompt_window()
    assert (window.engine, window.longest) == (512, 464)
    assert window.describe() == ("rollout.engine.max_model_len 512 less "
                                 "rollout.max_new_tokens 48")
    with pytest.raises(ValueError, match=r"max_model_len \(48\) must exceed "
                                         r"rollout.max_new_tokens \(48\)"):
        RunConfig.model_validate({**own, "rollout": {
            "max_new_tokens": 48, "engine": {"kind": "vllm", "max_model_len": 48}}})


def test_a_vllm_port_range_is_ordered_within_the_port_space():
    cfg = RunConfig.model_validate({"rollout": {"engine": {"kind": "vllm",
                                                           "port_range": [42000, 42099]}}})
    assert cfg.rollout.engine.port_range == (42000, 42099)
    for bad in ([42099, 42000], [80, 100], [65000, 70000]):
        with pytest.raises(ValueError, match="port_range: .* must be \\[first, last\\]"):
            RunConfig.model_validate({"rollout": {"engine": {"kind": "vllm",
                                                             "port_range": bad}}})


def test_a_section_written_twice_is_refused_naming_it(tmp_path):
    """YAML keeps the last of two equal keys; a config that sets `auth` twice would silently
    lose the first section, so it is refused."""
    path = tmp_path / "run.yaml"
    path.write_text("run_id: x\nauth: {required: false}\nredis: {}\nauth: {}\n")
    with pytest.raises(ConfigError, match="'auth' is set twice in one section"):
        load_run_config(path)
