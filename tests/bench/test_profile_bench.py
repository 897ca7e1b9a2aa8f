"""bench/profile_stack.py's bookkeeping on hand-written py-spy output (no services, no py-spy): a
stack is charged whole to the first bucket its files match, root to leaf, so a Redis call
made while publishing weights counts as publishing; the table is CPU per trained sample."""

import os

from bench.profile_stack import OTHER, bucket, cpu_seconds, markdown, split_samples

PUBLISH_VIA_REDIS = ("MainThread;run (trainer_svc/loop.py:120);publish "
                     "(trainer_svc/publisher.py:80);execute_command "
                     "(redis/client.py:600)")
TRAIN = ("MainThread;train_step (trainer_svc/loop.py:140);backward "
         "(/x/site-packages/torch/autograd/__init__.py:300)")
DECODE = ("MainThread;next_batch (trainer_svc/loop.py:90);decode_batch "
          "(relayrl/contracts/messages.py:50)")


def test_a_stack_is_charged_whole_to_its_first_matching_bucket():
    assert bucket(PUBLISH_VIA_REDIS) == "weight publish"
    assert bucket(TRAIN) == "trainer forward/backward"
    assert bucket(DECODE) == "encode, decode, validate, collate"
    assert bucket("MainThread;<module> (x.py:1);select (selectors.py:4)") == OTHER
    assert bucket("Thread.run (threading.py:9);_serve (grpc/_server.py:1)") == "gRPC"
    assert bucket("run (rollout_svc/worker.py:1);xadd (redis/commands/core.py:2)") == (
        "Redis client")


def test_raw_output_is_counted_by_bucket_and_odd_lines_are_skipped():
    raw = f"{PUBLISH_VIA_REDIS} 3\n{TRAIN} 5\n{TRAIN} 2\nnot a stack\n\n"
    assert split_samples(raw) == {"weight publish": 3, "trainer forward/backward": 7}


def test_cpu_seconds_counts_this_process():
    assert cpu_seconds(os.getpid()) > 0


def test_the_table_lists_every_process_of_every_bucket():
    result = {"steps": 2, "samples": 128, "wall_ms_per_sample": 4.0, "cpu_ms_per_sample": 7.5,
              "idle_share": 0.06, "py_spy_cpu_share": 0.1, "ms_per_sample": {
                  "trainer forward/backward": {"trainer": 1.5},
                  "engine (generate)": {"rollout-0": 1.0, "rollout-1": 1.25}}}
    table = markdown(result, "examples/tiny_cpu.yaml")
    assert "| bucket | total | rollout-0 | rollout-1 | trainer |" in table
    assert "cores idle 6% of the window, py-spy itself busy 10%" in table
    assert "| engine (generate) | 2.25 | 1.00 | 1.25 |  |" in table
