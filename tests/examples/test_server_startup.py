"""Every example's model server would start: the command line its user data hands to vLLM passes vLLM 0.13's own
start-up checks, as reimplemented from its source in ``tests/planner/vllm_startup_rules.py`` (independent of the
library's check). Round 1's command line fails the same check (``tests/planner/test_server_settings.py``)."""

from __future__ import annotations

import shlex

from genai_constructs.planner import load_catalog
from genai_constructs.workload import ModelShape
from tests.planner.test_server_settings import vllm_failures
from tests.support import Synthesized, resources_of_type, user_data_script


def _setting(script: str, name: str) -> str:
    (line,) = [line for line in script.splitlines() if line.startswith(f"readonly {name}=")]
    return shlex.split(line.split("=", 1)[1])[0]


def _server_args(script: str) -> list[str]:
    (line,) = [line for line in script.splitlines() if line.startswith("readonly -a SERVER_ARGS=(")]
    return shlex.split(line.removeprefix("readonly -a SERVER_ARGS=(").removesuffix(")"))


def test_every_examples_server_command_passes_vllms_startup_checks(examples_synth: Synthesized) -> None:
    checked = []
    for stack, template in examples_synth.templates.items():
        for logical_id, launch_template in resources_of_type(template, "AWS::EC2::LaunchTemplate").items():
            script = user_data_script(launch_template)
            if "readonly -a SERVER_ARGS=(" not in script:
                continue  # the embedding workers run no model server
            argv = _server_args(script)
            model = ModelShape.preset(_setting(script, "SERVED_MODEL_NAME"))
            instance = load_catalog().instance(launch_template["Properties"]["LaunchTemplateData"]["InstanceType"])
            if instance.is_neuron:
                continue  # vLLM-neuron has start-up rules of its own, not reimplemented here
            assert "--max-model-len" in argv, (stack, logical_id)
            tensor_parallel = int(argv[argv.index("--tensor-parallel-size") + 1])
            assert vllm_failures(model, instance, argv, tensor_parallel) == [], (stack, logical_id, argv)
            checked.append((stack, instance.instance_type))
    # The realtime chat (g6), the 70B chat (p-family, blue and green) and the RAG tier's generator.
    assert len(checked) >= 3, checked
