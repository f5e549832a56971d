"""The blue/green rollout, run: the state machine definition the stack deploys (``rollout_definition``), executed
state by state against moto on 127.0.0.1, over HTTP, with real ELBv2 listener weights, Auto Scaling groups and warm
pools, target health, CloudWatch alarm states (``set_alarm_state``), SNS, the SSM parameter that is the rollout lock,
and Step Functions' own execution list.

Step Functions itself is not emulated by moto (its executions stay RUNNING and run nothing), so ``Interpreter`` below
runs the Amazon States Language states the definition uses (Task with ``aws-sdk`` integrations, Choice, Pass, Wait,
Succeed, Fail; Parameters, ResultSelector, ResultPath, Catch; the JSONPath and intrinsic functions in it) the way the
States Language specification and the Step Functions developer guide describe them ("AWS SDK service integrations":
parameters and results in PascalCase). Wait states advance a virtual clock, so a 40-minute rollout runs in a second;
the clock is what "time from a failing alarm to all traffic on the old slot" is measured in, beside wall time.

moto has no ``DescribeInstanceRefreshes``; the interpreter answers it with "no refresh" (the new slot's launch
template is already in place), which is what the real call returns once the idle slot's refresh has finished.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from genai_constructs.fleets.rollout import (
    RolloutPolicy,
    RolloutSlot,
    execution_input_document,
    rollout_definition,
)

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
from botocore import xform_name  # noqa: E402  (after the skip: botocore comes with boto3)

REGION = "us-east-1"
BOTO3_NAMES = {"sfn": "stepfunctions", "elasticloadbalancingv2": "elbv2"}
"""Step Functions' aws-sdk service names that differ from boto3's."""


_CLIENTS: dict[tuple[str, str], Any] = {}


def _client(endpoint_url: str, service: str) -> Any:
    """One boto3 client per service and endpoint (creating one costs more than the call)."""
    key = (endpoint_url, service)
    if key not in _CLIENTS:
        _CLIENTS[key] = boto3.client(service, endpoint_url=endpoint_url, region_name=REGION,
                                     aws_access_key_id="testing", aws_secret_access_key="testing")
    return _CLIENTS[key]


class _Missing(Exception):
    """A JSONPath that selects nothing (States.Runtime in Step Functions; IsPresent false in a Choice)."""


# ---- JSONPath and intrinsic functions: the subset the rollout definition uses ------------------------------------

_TOKEN = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[\*\]"
                    r"|\[\?\(@((?:\.[A-Za-z_][A-Za-z0-9_]*)+) == '([^']*)'\)\]")


def select(path: str, data: Any, context: dict[str, Any]) -> Any:
    """``$...`` on the state's input, ``$$...`` on the context object."""
    if path.startswith("$$"):
        current, rest = context, path[2:]
    else:
        current, rest = data, path[1:]
    many = False
    values = [current]
    position = 0
    while position < len(rest):
        match = _TOKEN.match(rest, position)
        assert match, f"unsupported JSONPath {path!r} at {rest[position:]!r}"
        position = match.end()
        name, index, filter_path, filter_value = match.groups()
        next_values: list[Any] = []
        for value in values:
            if name is not None:
                if isinstance(value, dict) and name in value:
                    next_values.append(value[name])
                elif not many:
                    raise _Missing(path)
            elif index is not None:
                if isinstance(value, list) and int(index) < len(value):
                    next_values.append(value[int(index)])
                elif not many:
                    raise _Missing(path)
            elif filter_path is not None:
                many = True
                for item in value if isinstance(value, list) else []:
                    try:
                        if select("$" + filter_path, item, context) == filter_value:
                            next_values.append(item)
                    except _Missing:
                        pass
            else:  # [*]
                many = True
                next_values.extend(value if isinstance(value, list) else [])
        values = next_values
    return values if many else values[0]


def _split_arguments(text: str) -> list[str]:
    arguments, depth, quoted, start = [], 0, False, 0
    for i, char in enumerate(text):
        if char == "'" and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and char == "(":
            depth += 1
        elif not quoted and char == ")":
            depth -= 1
        elif not quoted and depth == 0 and char == ",":
            arguments.append(text[start:i].strip())
            start = i + 1
    if text.strip():
        arguments.append(text[start:].strip())
    return arguments


def evaluate(expression: str, data: Any, context: dict[str, Any]) -> Any:
    """A ``.$`` value: a path, or an intrinsic function (nested calls, paths, string and number literals)."""
    match = re.fullmatch(r"(States\.[A-Za-z]+)\((.*)\)", expression.strip(), re.S)
    if not match:
        return select(expression, data, context)
    name, body = match.groups()
    arguments: list[Any] = []
    for argument in _split_arguments(body):
        if argument.startswith("'"):
            arguments.append(argument[1:-1].replace("\\'", "'"))
        elif argument.startswith("$"):
            arguments.append(select(argument, data, context))
        elif argument.startswith("States."):
            arguments.append(evaluate(argument, data, context))
        else:
            arguments.append(json.loads(argument))
    if name == "States.Array":
        return arguments
    if name == "States.ArrayLength":
        return len(arguments[0])
    if name == "States.MathAdd":
        return arguments[0] + arguments[1]
    if name == "States.JsonToString":
        return json.dumps(arguments[0], separators=(",", ":"))
    if name == "States.StringToJson":
        return json.loads(arguments[0])
    if name == "States.Format":
        template, *values = arguments
        pieces = template.split("{}")
        assert len(pieces) == len(values) + 1, expression
        return "".join(p + (str(v) if i < len(values) else "") for i, (p, v) in
                       enumerate(zip(pieces, [*values, ""], strict=True)))
    raise AssertionError(f"intrinsic {name} is not in the rollout definition's subset")


def payload(template: Any, data: Any, context: dict[str, Any]) -> Any:
    """Parameters / ResultSelector: keys ending in ``.$`` are evaluated, the rest copied."""
    if isinstance(template, dict):
        return {k.removesuffix(".$"): (evaluate(v, data, context) if k.endswith(".$") else payload(v, data, context))
                for k, v in template.items()}
    if isinstance(template, list):
        return [payload(v, data, context) for v in template]
    return template


def with_result(data: Any, result_path: str | None, result: Any) -> Any:
    if result_path is None:
        return data
    if result_path == "$":
        return result
    data = json.loads(json.dumps(data))
    keys = result_path[2:].split(".")
    target = data
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = result
    return data


def _rule(rule: dict[str, Any], data: Any, context: dict[str, Any]) -> bool:
    if "Or" in rule:
        return any(_rule(r, data, context) for r in rule["Or"])
    if "And" in rule:
        return all(_rule(r, data, context) for r in rule["And"])
    if "Not" in rule:
        return not _rule(rule["Not"], data, context)
    try:
        value = select(rule["Variable"], data, context)
        present = True
    except _Missing:
        value, present = None, False
    if "IsPresent" in rule:
        return present == rule["IsPresent"]
    if not present:
        raise _Missing(rule["Variable"])  # States.Runtime in Step Functions
    for operator, compare in (("NumericGreaterThan", lambda a, b: a > b),
                              ("NumericGreaterThanEquals", lambda a, b: a >= b),
                              ("StringEquals", lambda a, b: a == b)):  # and each one's ...Path form
        if operator in rule:
            return bool(compare(value, rule[operator]))
        if operator + "Path" in rule:
            return bool(compare(value, select(rule[operator + "Path"], data, context)))
    raise AssertionError(f"choice rule {rule} is not in the rollout definition's subset")


# ---- AWS SDK integrations against the emulator -----------------------------------------------------------------


def _pascal(value: Any) -> Any:
    if isinstance(value, dict):
        return {k[:1].upper() + k[1:]: _pascal(v) for k, v in value.items() if k != "ResponseMetadata"}
    if isinstance(value, list):
        return [_pascal(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


@dataclass
class Call:
    at_s: float
    """Virtual seconds since the execution started."""
    wall: float
    service: str
    action: str
    parameters: dict[str, Any]


@dataclass
class Interpreter:
    """One execution of ``definition``; ``run()`` yields ``(state name, virtual seconds)`` after every state."""

    definition: dict[str, Any]
    endpoint_url: str
    state_machine_arn: str
    execution_arn: str
    overrides: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = field(default_factory=dict)
    clock_s: float = 0.0
    calls: list[Call] = field(default_factory=list)
    outcome: tuple[str, str | None] | None = None
    """("Succeed", None) or ("Fail", Error) once the execution has ended."""

    def _client(self, service: str) -> Any:
        return _client(self.endpoint_url, BOTO3_NAMES.get(service, service))

    def _call(self, resource: str, parameters: dict[str, Any]) -> Any:
        service, action = resource.removeprefix("arn:aws:states:::aws-sdk:").split(":")
        self.calls.append(Call(self.clock_s, time.perf_counter(), service, action, parameters))
        if (service, action) in self.overrides:
            return self.overrides[(service, action)](parameters)
        client = self._client(service)
        operation = client.meta.service_model.operation_model(action[:1].upper() + action[1:])
        members = {name.lower(): name for name in operation.input_shape.members}
        native = {members[k.lower()]: v for k, v in parameters.items()}
        return _pascal(getattr(client, xform_name(operation.name))(**native))

    def run(self, execution_input: dict[str, Any]) -> Iterator[tuple[str, float]]:
        context = {"StateMachine": {"Id": self.state_machine_arn}, "Execution": {"Id": self.execution_arn}}
        data: Any = execution_input
        name = self.definition["StartAt"]
        while True:
            state = self.definition["States"][name]
            kind = state["Type"]
            next_name = state.get("Next")
            if kind == "Task":
                parameters = payload(state.get("Parameters", {}), data, context)
                try:
                    result = self._call(state["Resource"], parameters)
                    if "ResultSelector" in state:
                        result = payload(state["ResultSelector"], result, context)
                    data = with_result(data, state.get("ResultPath", "$"), result)
                except Exception as error:  # noqa: BLE001  (Catch States.ALL, as Step Functions does)
                    catch = next((c for c in state.get("Catch", []) if "States.ALL" in c["ErrorEquals"]), None)
                    if catch is None:
                        raise
                    data = with_result(data, catch.get("ResultPath", "$"),
                                       {"Error": type(error).__name__, "Cause": str(error)})
                    next_name = catch["Next"]
            elif kind == "Pass":
                result = (payload(state["Parameters"], data, context) if "Parameters" in state
                          else state.get("Result", data))
                data = with_result(data, state.get("ResultPath", "$"), result)
            elif kind == "Choice":
                next_name = next((c["Next"] for c in state["Choices"] if _rule(c, data, context)), state["Default"])
            elif kind == "Wait":
                self.clock_s += state["Seconds"]
            elif kind in ("Succeed", "Fail"):
                self.outcome = (kind, state.get("Error"))
                yield name, self.clock_s
                return
            else:
                raise AssertionError(f"state type {kind} is not in the rollout definition's subset")
            yield name, self.clock_s
            name = next_name


# ---- The emulator and a two-slot fleet in it ----------------------------------------------------------------------

POLICY = RolloutPolicy()
READY_TIMEOUT_S = 1200
DEFINITION = rollout_definition(POLICY, ready_timeout_s=READY_TIMEOUT_S)
MIN_INSTANCES = 2
LOCK = "/genai-constructs/chat/no-rollout-running"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@dataclass
class Fleet:
    endpoint_url: str
    listener_arn: str
    target_groups: dict[str, str]
    groups: dict[str, str]
    alarms: dict[str, list[str]]
    topic_arn: str
    state_machine_arn: str

    def client(self, service: str) -> Any:
        return _client(self.endpoint_url, service)

    def weights(self) -> tuple[int, int]:
        """(blue, green) percent, as the listener forwards now."""
        (action,) = self.client("elbv2").describe_listeners(ListenerArns=[self.listener_arn])["Listeners"][0][
            "DefaultActions"]
        by_arn = {g["TargetGroupArn"]: g["Weight"] for g in action["ForwardConfig"]["TargetGroups"]}
        return by_arn[self.target_groups["Blue"]], by_arn[self.target_groups["Green"]]

    def capacity(self, slot: str) -> tuple[int, int]:
        (group,) = self.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.groups[slot]])["AutoScalingGroups"]
        return group["MinSize"], group["DesiredCapacity"]

    def slot(self, name: str, version: str) -> RolloutSlot:
        return RolloutSlot(name=name, version=version, group_name=self.groups[name],
                           target_group_arn=self.target_groups[name], alarm_names=tuple(self.alarms[name]),
                           alarm_arns=())

    def execution(self, *, to: str = "Green", version: str = "v2") -> tuple[Interpreter, dict[str, Any]]:
        """Start an execution in the emulator (so ListExecutions sees it RUNNING) and its interpreter: a release of
        ``version`` to slot ``to``, from the other slot serving v1."""
        old = "Blue" if to == "Green" else "Green"
        document = execution_input_document(
            listener_arn=self.listener_arn, topic_arn=self.topic_arn, min_instances=MIN_INSTANCES, lock_name=LOCK,
            old=self.slot(old, "v1"), new=self.slot(to, version))
        arn = self.client("stepfunctions").start_execution(
            stateMachineArn=self.state_machine_arn, input=json.dumps(document))["executionArn"]
        interpreter = Interpreter(DEFINITION, self.endpoint_url, self.state_machine_arn, arn, overrides={
            ("autoscaling", "describeInstanceRefreshes"): lambda _: {"InstanceRefreshes": []},
            ("autoscaling", "describeWarmPool"): self._warm_pool_instances,
            # moto has no RollbackInstanceRefresh; AWS answers with the rollback's id.
            ("autoscaling", "rollbackInstanceRefresh"): lambda _: {"InstanceRefreshId": "rollback-1"}})
        return interpreter, document

    def lock_is_free(self) -> bool:
        """True while the rollout lock's parameter exists (no rollout holds it)."""
        names = [p["Name"] for p in self.client("ssm").describe_parameters()["Parameters"]]
        return LOCK in names

    def serving_release(self) -> dict[str, str]:
        """The release the lock records as serving."""
        return dict(json.loads(self.client("ssm").get_parameter(Name=LOCK)["Parameter"]["Value"]))

    def warm_pool(self, slot: str) -> tuple[int, int]:
        """(MinSize, MaxGroupPreparedCapacity) of the slot's warm pool."""
        pool = self.client("autoscaling").describe_warm_pool(AutoScalingGroupName=self.groups[slot])[
            "WarmPoolConfiguration"]
        return pool.get("MinSize", 0), pool.get("MaxGroupPreparedCapacity", -1)

    def _warm_pool_instances(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """DescribeWarmPool as AWS answers it once the deploy has prepared the new slot's pool (moto launches no
        warm-pool instances): the fleet's minimum stopped and ready, one more still preparing."""
        states = ["Warmed:Stopped"] * MIN_INSTANCES + ["Warmed:Pending"]
        return {"Instances": [{"InstanceId": f"i-{i}", "LifecycleState": s} for i, s in enumerate(states)]}

    def finish(self, interpreter: Interpreter) -> None:
        """What Step Functions does when an execution ends: it is no longer RUNNING (moto can only stop it)."""
        self.client("stepfunctions").stop_execution(executionArn=interpreter.execution_arn)


@pytest.fixture
def fleet(endpoint: str) -> Fleet:
    """Blue serving v1 on two instances, green idle at zero: a fleet right after a deploy that names green live."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).read()
    ec2, elb, asg = (_client(endpoint, s) for s in ("ec2", "elbv2", "autoscaling"))
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"{REGION}{zone}")[
        "Subnet"]["SubnetId"] for i, zone in enumerate("ab")]
    balancer = elb.create_load_balancer(Name="chat", Subnets=subnets, Scheme="internal")["LoadBalancers"][0][
        "LoadBalancerArn"]
    target_groups = {slot: elb.create_target_group(Name=f"chat-{slot.lower()}", Protocol="HTTP", Port=8000,
                                                   VpcId=vpc, TargetType="instance")["TargetGroups"][0][
        "TargetGroupArn"] for slot in ("Blue", "Green")}
    listener = elb.create_listener(LoadBalancerArn=balancer, Protocol="HTTP", Port=80, DefaultActions=[
        {"Type": "forward", "ForwardConfig": {"TargetGroups": [
            {"TargetGroupArn": target_groups["Blue"], "Weight": 100},
            {"TargetGroupArn": target_groups["Green"], "Weight": 0}]}}])["Listeners"][0]["ListenerArn"]
    image = ec2.describe_images(Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}], MaxResults=5)[
        "Images"][0]["ImageId"]
    template = ec2.create_launch_template(LaunchTemplateName="chat", LaunchTemplateData={
        "ImageId": image, "InstanceType": "t3.micro"})["LaunchTemplate"]["LaunchTemplateId"]
    groups = {}
    for slot, size in (("Blue", MIN_INSTANCES), ("Green", 0)):
        groups[slot] = f"chat-{slot.lower()}"
        asg.create_auto_scaling_group(
            AutoScalingGroupName=groups[slot], LaunchTemplate={"LaunchTemplateId": template}, MinSize=size,
            MaxSize=4, DesiredCapacity=size, TargetGroupARNs=[target_groups[slot]], VPCZoneIdentifier=",".join(subnets))
    cloudwatch = _client(endpoint, "cloudwatch")
    alarms: dict[str, list[str]] = {}
    for slot in ("Blue", "Green"):
        alarms[slot] = []
        for metric in ("P95TimeToFirstToken", "P95TimePerOutputToken", "Http5xxRate", "UnhealthyHosts"):
            name = f"Chat{slot}{metric}Alarm"
            cloudwatch.put_metric_alarm(AlarmName=name, MetricName=metric, Namespace="GenaiConstructs/Inference",
                                        Statistic="Average", Period=60, EvaluationPeriods=3, Threshold=1,
                                        ComparisonOperator="GreaterThanThreshold")
            cloudwatch.set_alarm_state(AlarmName=name, StateValue="OK", StateReason="no breach")
            alarms[slot].append(name)
    topic = _client(endpoint, "sns").create_topic(Name="chat-alarms")["TopicArn"]
    # What the deploy that names green live leaves: green has the warm pool, blue's is empty; the lock is free (the
    # deploy's RolloutLockCheck wrote it when the fleet was created).
    for slot, (pool_min, pool_max) in (("Blue", (0, 0)), ("Green", (1, -1))):
        asg.put_warm_pool(AutoScalingGroupName=groups[slot], MinSize=pool_min, MaxGroupPreparedCapacity=pool_max,
                          PoolState="Stopped")
    _client(endpoint, "ssm").put_parameter(Name=LOCK, Value='{"slot":"Blue","version":"v1"}', Type="String",
                                           Overwrite=True)
    machine = _client(endpoint, "stepfunctions").create_state_machine(
        name="chat-rollout", definition=json.dumps(DEFINITION),
        roleArn="arn:aws:iam::123456789012:role/chat-rollout")["stateMachineArn"]
    return Fleet(endpoint, listener, target_groups, groups, alarms, topic, machine)


def _shifts(interpreter: Interpreter) -> list[tuple[int, int]]:
    """(old, new) weights of every ModifyListener call, in order."""
    out = []
    for call in interpreter.calls:
        if call.action == "modifyListener":
            (action,) = call.parameters["DefaultActions"]
            old, new = action["ForwardConfig"]["TargetGroups"]
            out.append((old["Weight"], new["Weight"]))
    return out


def _published(interpreter: Interpreter) -> list[str]:
    return [c.parameters["Message"] for c in interpreter.calls if c.action == "publish"]


# ---- The rollout ---------------------------------------------------------------------------------------------------


def test_weights_step_as_planned_when_the_alarms_stay_ok(fleet: Fleet) -> None:
    interpreter, _ = fleet.execution()
    seen: list[tuple[str, tuple[int, int]]] = []
    for state, _clock in interpreter.run(_input(fleet, interpreter)):  # the input as the emulator stored it
        if state.startswith("Shift"):
            seen.append((state, fleet.weights()))  # what the listener really forwards, read back from moto
    fleet.finish(interpreter)
    assert interpreter.outcome == ("Succeed", None)
    assert seen == [("Shift5", (95, 5)), ("Shift25", (75, 25)), ("Shift50", (50, 50)), ("Shift100", (0, 100))]
    assert _shifts(interpreter) == [(95, 5), (75, 25), (50, 50), (0, 100)]
    # The new slot's warm pool was read ready before the new slot was sized (so its instances resume, warm).
    actions = [(c.action, c.parameters.get("AutoScalingGroupName")) for c in interpreter.calls]
    assert actions.index(("describeWarmPool", fleet.groups["Green"])) < actions.index(
        ("updateAutoScalingGroup", fleet.groups["Green"]))
    assert fleet.capacity("Green") == (MIN_INSTANCES, MIN_INSTANCES)
    assert fleet.capacity("Blue") == (0, 0)
    # Four bakes of 10 minutes with every alarm read every 30 s; moto's targets are healthy at once.
    assert interpreter.clock_s == POLICY.duration_s() == 2400
    assert sum(c.action == "describeAlarms" for c in interpreter.calls) == 4 * (600 // 30 + 1)
    assert _published(interpreter) == [
        "Rollout complete: version v2 (slot Green) serves every request; slot Blue (version v1) scales to zero."]
    assert fleet.lock_is_free() and fleet.serving_release() == {"slot": "Green", "version": "v2"}


def _input(fleet: Fleet, interpreter: Interpreter) -> dict[str, Any]:
    (execution,) = [e for e in fleet.client("stepfunctions").list_executions(
        stateMachineArn=fleet.state_machine_arn)["executions"] if e["executionArn"] == interpreter.execution_arn]
    described = fleet.client("stepfunctions").describe_execution(executionArn=execution["executionArn"])
    return dict(json.loads(described["input"]))


def test_one_alarm_mid_rollout_sends_every_request_back_to_the_old_slot(fleet: Fleet) -> None:
    interpreter, document = fleet.execution()
    run = interpreter.run(document)
    polls = 0
    for state, _clock in run:
        if state == "Bake25Judge":
            polls += 1
            if polls == 7:  # three minutes into the 25 % bake, just after a read found every alarm OK: the worst
                break       # moment for the alarm to trip, a whole poll before the next read
    assert fleet.weights() == (75, 25)
    failing = fleet.alarms["Green"][0]
    fleet.client("cloudwatch").set_alarm_state(AlarmName=failing, StateValue="ALARM",
                                               StateReason="p95 TTFT above target for 2 of 3 minutes")
    alarm_at_s, alarm_wall = interpreter.clock_s, time.perf_counter()
    back_at_s = back_wall = None
    for state, clock in run:
        if state == "RollBack":
            back_at_s, back_wall = clock, time.perf_counter()
            assert fleet.weights() == (100, 0)  # every request on the old slot, read back from moto
    fleet.finish(interpreter)
    assert interpreter.outcome == ("Fail", "RolledBack")
    assert back_at_s is not None and back_wall is not None
    assert back_at_s - alarm_at_s == POLICY.alarm_poll.to_seconds()  # designed: within one poll, plus one call
    assert back_wall - alarm_wall < 2.0
    print(f"\nalarm to all traffic on the old slot: {back_at_s - alarm_at_s:g} s of rollout clock (poll "
          f"{POLICY.alarm_poll.to_seconds():g} s), {1000 * (back_wall - alarm_wall):.0f} ms of wall time in the "
          "emulator")
    assert _shifts(interpreter) == [(95, 5), (75, 25), (100, 0)]
    assert fleet.weights() == (100, 0)
    assert fleet.capacity("Green") == (0, 0)
    assert fleet.capacity("Blue") == (MIN_INSTANCES, MIN_INSTANCES)
    # The slot serving again gets its warm pool back; the failed version's pool is emptied (no EBS for it).
    assert (fleet.warm_pool("Blue"), fleet.warm_pool("Green")) == ((1, -1), (0, 0))
    assert fleet.lock_is_free() and fleet.serving_release() == {"slot": "Blue", "version": "v1"}
    (message,) = _published(interpreter)
    assert "rolled back" in message and failing in message and "slot Blue (version v1)" in message


def test_a_second_rollout_during_a_rollout_is_refused_and_never_interleaves(fleet: Fleet) -> None:
    first, first_input = fleet.execution()
    run = first.run(first_input)
    for state, _clock in run:
        if state == "Bake5Wait":
            break
    assert fleet.weights() == (95, 5)
    assert not fleet.lock_is_free()  # what a deploy's RolloutLockCheck reads, and fails on, mid-rollout
    second, second_input = fleet.execution(to="Blue")  # a deploy naming the other slot, mid-rollout
    for _ in second.run(second_input):
        pass
    fleet.finish(second)
    assert second.outcome == ("Fail", "RolloutInProgress")
    assert _shifts(second) == [] and [c.action for c in second.calls] == ["getParameter", "publish"]
    assert not fleet.lock_is_free()  # the refused execution leaves the first one's lock alone
    assert "refused" in _published(second)[0]
    assert fleet.weights() == (95, 5)  # untouched
    for _ in run:
        pass
    fleet.finish(first)
    assert first.outcome == ("Succeed", None)
    assert _shifts(first) == [(95, 5), (75, 25), (50, 50), (0, 100)]
    assert fleet.lock_is_free()


def test_a_version_changed_in_place_in_the_serving_slot_is_undone_and_refused(fleet: Fleet) -> None:
    # One ModelArtifact edited from v1 to v3 instead of appended: the release names the serving slot (blue) with a
    # new version, and the deploy has started blue's instance refresh to it.
    interpreter, document = fleet.execution(to="Blue", version="v3")
    for _ in interpreter.run(document):
        pass
    fleet.finish(interpreter)
    assert interpreter.outcome == ("Fail", "InPlaceVersionChange")
    (undo,) = [c for c in interpreter.calls if c.action == "rollbackInstanceRefresh"]
    assert undo.parameters == {"AutoScalingGroupName": fleet.groups["Blue"]}
    assert _shifts(interpreter) == [] and fleet.weights() == (100, 0)
    assert fleet.capacity("Blue") == (MIN_INSTANCES, MIN_INSTANCES) and fleet.capacity("Green") == (0, 0)
    (message,) = _published(interpreter)
    assert "Version v3 was deployed to slot Blue, which serves version v1" in message and "appending" in message
    assert fleet.lock_is_free() and fleet.serving_release() == {"slot": "Blue", "version": "v1"}


def test_nothing_moves_when_the_old_slot_has_no_instances(fleet: Fleet) -> None:
    # The first deploy (green created idle, blue live) and a redeploy after a finished rollout start an execution
    # towards the slot that already serves: the other slot is at zero, so nothing happens.
    interpreter, document = fleet.execution(to="Blue", version="v1")
    for _ in interpreter.run(document):
        pass
    fleet.finish(interpreter)
    assert interpreter.outcome == ("Succeed", None)
    assert _shifts(interpreter) == [] and fleet.weights() == (100, 0)
    assert fleet.capacity("Blue") == (MIN_INSTANCES, MIN_INSTANCES)
    assert fleet.lock_is_free()


# ---- The interpreter's own subset ----------------------------------------------------------------------------------


def test_interpreter_paths_and_intrinsics() -> None:
    data = {"a": {"b": [{"s": {"v": "healthy"}, "n": 1}, {"s": {"v": "draining"}, "n": 2}]}, "x": 3}
    assert select("$.a.b[1].n", data, {}) == 2
    assert select("$.a.b[*].n", data, {}) == [1, 2]
    assert select("$.a.b[?(@.s.v == 'healthy')]", data, {}) == [data["a"]["b"][0]]
    assert select("$$.StateMachine.Id", {}, {"StateMachine": {"Id": "arn"}}) == "arn"
    with pytest.raises(_Missing):
        select("$.a.b[2]", data, {})
    assert evaluate("States.MathAdd($.x, 30)", data, {}) == 33
    assert evaluate("States.Format('{} of {}', $.x, States.JsonToString($.a.b[*].n))", data, {}) == "3 of [1,2]"
    assert evaluate("States.ArrayLength(States.Array($.x, $.x))", data, {}) == 2


# ---- The policy --------------------------------------------------------------------------------------------------


def test_policy_defaults_and_every_problem_at_once() -> None:
    from aws_cdk import Duration

    from genai_constructs.errors import ConfigurationError

    assert (POLICY.steps, POLICY.bake.to_seconds(), POLICY.alarm_poll.to_seconds()) == ((5, 25, 50, 100), 600, 30)
    assert POLICY.duration_s(ready_s=620) == 620 + 2400  # an 8B slot: pool prepared, resumed, healthy; four bakes
    with pytest.raises(ConfigurationError) as raised:
        RolloutPolicy(steps=(50, 25), bake=Duration.seconds(30), alarm_poll=Duration.seconds(45))
    text = str(raised.value)
    for needle in ("steps ((50, 25)) must increase strictly", "bake (30 s) must be at least 60 s",
                   "alarm_poll (45 s) must be between 1 s and the bake"):
        assert needle in text, needle
    with pytest.raises(ConfigurationError, match=r"steps \(\[5, True\]\) must be a tuple of whole percentages"):
        RolloutPolicy(steps=[5, True])  # type: ignore[arg-type]
