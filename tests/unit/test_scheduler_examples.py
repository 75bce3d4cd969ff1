"""The scheduler examples that cannot run here (Kubernetes, SkyPilot) stay in step with
``potluck run``: each one's command parses with its flags and names a script that exists,
and the Indexed Job's node 0 address is the name Kubernetes gives its pod 0."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

from potluck.launch import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _commands(name: str) -> list[list[str]]:
    """Every ``potluck run ...`` command in an example, as argv from ``run`` on."""
    text = (EXAMPLES / name).read_text()
    if name.endswith(".yaml") and "command:" in text:
        lists = re.findall(r"command: (\[.*?\])", text, re.DOTALL)
        argvs = [json.loads(found) for found in lists]
    else:
        lines = text.replace("\\\n", " ").splitlines()  # a shell line continued
        argvs = [shlex.split(line) for line in lines
                 if "potluck run" in line and not line.lstrip().startswith("#")]
    runs = [argv[argv.index("potluck") + 2:] for argv in argvs if "potluck" in argv]
    assert runs, f"no potluck run command in examples/{name}"
    return runs


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("name", ["slurm.sbatch", "k8s-pytorchjob.yaml", "k8s-job.yaml",
                                  "skypilot.yaml"])
def test_each_example_runs_an_existing_script_with_known_flags(name: str) -> None:
    for argv in _commands(name):
        args = _parse(argv)
        assert (ROOT / args.script).is_file(), f"examples/{name} runs {args.script}"
        assert args.script_args[:1] == ["--steps"]


def test_the_indexed_job_names_its_pod_0_and_counts_its_completions() -> None:
    text = (EXAMPLES / "k8s-job.yaml").read_text()
    (argv,) = _commands("k8s-job.yaml")
    args = _parse(argv)
    job = re.search(r"kind: Job\nmetadata:\n  name: (\S+)", text)
    service = re.search(r"kind: Service\nmetadata:\n  name: (\S+)", text)
    completions = re.search(r"completions: (\d+)", text)
    assert job and service and completions
    assert f"subdomain: {service.group(1)}" in text
    assert f"job-name: {job.group(1)}" in text  # the Service selects the Job's pods
    assert args.master_addr == f"{job.group(1)}-0.{service.group(1)}"
    assert args.nnodes == completions.group(1)


def test_the_pytorchjob_container_has_the_name_the_operator_looks_for() -> None:
    text = (EXAMPLES / "k8s-pytorchjob.yaml").read_text()
    assert "- name: pytorch " in text and "kind: PyTorchJob" in text
    (argv,) = _commands("k8s-pytorchjob.yaml")  # one template, shared by both replicas
    args = _parse(argv)
    assert args.nnodes is None and args.node_rank is None and args.master_addr is None
