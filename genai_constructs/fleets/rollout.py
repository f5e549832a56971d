"""Blue/green rollouts of a new model version: a Step Functions state machine that shifts the listener's weights in
steps, bakes at each, judges the new slot by its own alarms and rolls every request back to the old slot on the first
alarm. See docs/rollouts.md.

The state machine uses only Step Functions' AWS SDK service integrations (``arn:aws:states:::aws-sdk:<service>:
<action>``, AWS Step Functions developer guide, "AWS SDK service integrations"): no function of ours runs, so there is
no Lambda to place in the VPC, queue, cap or encrypt, and the whole rollout is the definition below. Everything that
differs between deploys (which slot is old, which is new, their groups, target groups, alarms) is the execution's
input, written by the deploy-time trigger; the definition itself is plain JSON, so a test can run the very definition
the stack deploys (tests/runtime/test_rollout.py runs it against moto on 127.0.0.1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import _launch
from genai_constructs.network import _checks as checks
from genai_constructs.planner.deployment import WARM_POOL_MIN_SIZE

DEFAULT_STEPS: tuple[int, ...] = (5, 25, 50, 100)
"""Percent of requests on the new slot at each step. 5 % first: enough requests in a ten-minute bake for p95 latency
and a 5XX rate to mean something (at 10 requests/s, 3,000 requests), while a bad version reaches 1 in 20 users;
then 25 and 50 % (the new slot's own scaling has caught up with a quarter, then half the load) before everything."""
DEFAULT_BAKE = Duration.minutes(10)
"""Bake at each step: twice the alarms' five-minute window (3 bad minutes of 5 trip them), so a version that degrades
under sustained load trips them before the next step; four steps make a 40-minute rollout."""
DEFAULT_ALARM_POLL = Duration.seconds(30)
"""How often the bake reads the new slot's alarms: an alarm that trips mid-bake sends every request back within
30 s plus one API call, not at the end of the bake."""
MIN_BAKE = Duration.minutes(1)
"""Below one minute no one-minute alarm datapoint can even arrive."""
READY_POLL = Duration.seconds(30)
"""How often the rollout checks whether the new slot's targets are healthy."""
STATE_MACHINE_TIMEOUT = Duration.hours(24)
"""A rollout longer than a day is stuck; Step Functions fails the execution (its traffic stays where it was)."""
ROLLOUT_LOG_RETENTION = logs.RetentionDays.ONE_YEAR
"""As the fleet's other logs: the rollout's history is part of the change record."""
NO_RELEASE_YET = '{"slot":"none","version":"none"}'
"""The rollout-lock parameter's first value (written when the fleet is created). While it exists (no rollout runs)
the parameter holds the release that serves, as JSON ``{"slot": ..., "version": ...}``, written by every rollout's
end: what the next execution compares its release with."""


@dataclass(frozen=True)
class RolloutPolicy:
    """How a new model version takes traffic. Default: 5, 25, 50, 100 % with a 10-minute bake at each.

    :param steps: percent of requests on the new slot at each step, increasing, ending at 100.
    :param bake: how long each step holds before the next, judged by the new slot's alarms throughout.
    :param alarm_poll: how often the bake reads the alarms (the designed rollback time is this plus one call).
    """

    steps: tuple[int, ...] = DEFAULT_STEPS
    bake: Duration = field(default=DEFAULT_BAKE)
    alarm_poll: Duration = field(default=DEFAULT_ALARM_POLL)

    def __post_init__(self) -> None:
        problems: list[str] = []
        steps = self.steps
        if (not isinstance(steps, (tuple, list)) or not steps
                or any(isinstance(s, bool) or not isinstance(s, int) for s in steps)):
            problems.append(f"steps ({steps!r}) must be a tuple of whole percentages ending at 100: e.g. "
                            f"{DEFAULT_STEPS!r}")
        elif list(steps) != sorted(set(steps)) or steps[0] < 1 or steps[-1] != 100:
            problems.append(f"steps ({tuple(steps)!r}) must increase strictly from at least 1 and end at 100 (all "
                            f"traffic on the new version): e.g. {DEFAULT_STEPS!r}")
        bake_ok = checks.instance_of(problems, "bake", self.bake, Duration, allowed="a Duration",
                                     fix="e.g. bake=Duration.minutes(10)")
        poll_ok = checks.instance_of(problems, "alarm_poll", self.alarm_poll, Duration, allowed="a Duration",
                                     fix="e.g. alarm_poll=Duration.seconds(30)")
        if bake_ok and self.bake.to_seconds() < MIN_BAKE.to_seconds():
            problems.append(f"bake ({self.bake.to_seconds():g} s) must be at least {MIN_BAKE.to_seconds():g} s: no "
                            "one-minute alarm datapoint arrives sooner; e.g. bake=Duration.minutes(10)")
        if bake_ok and poll_ok and not 1 <= self.alarm_poll.to_seconds() <= self.bake.to_seconds():
            problems.append(f"alarm_poll ({self.alarm_poll.to_seconds():g} s) must be between 1 s and the bake "
                            f"({self.bake.to_seconds():g} s): e.g. alarm_poll=Duration.seconds(30)")
        if problems:
            raise ConfigurationError("RolloutPolicy", problems)
        object.__setattr__(self, "steps", tuple(steps))

    def duration_s(self, *, ready_s: float = 0.0) -> float:
        """Seconds from start to the old slot scaling to zero when every alarm stays OK: the new slot's start-up
        (``ready_s``) plus one bake per step."""
        return ready_s + len(self.steps) * self.bake.to_seconds()


def _sdk(service: str, action: str) -> str:
    return f"arn:aws:states:::aws-sdk:{service}:{action}"


def _task(service: str, action: str, parameters: dict[str, Any], next_state: str, *,
          result_selector: dict[str, Any] | None = None, result_path: str | None = None,
          catch: bool = True) -> dict[str, Any]:
    state: dict[str, Any] = {"Type": "Task", "Resource": _sdk(service, action), "Parameters": parameters,
                             "ResultPath": result_path, "Next": next_state}
    if result_selector is not None:
        state["ResultSelector"] = result_selector
    if catch:
        # Any failed call during the rollout (throttling past the retries, a permission) rolls back: the old slot
        # still holds its capacity, so it is the safe place for traffic.
        state["Catch"] = [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.failure", "Next": "RollBack"}]
    state["Retry"] = [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 2, "MaxAttempts": 3, "BackoffRate": 2}]
    return state


def _notify(subject: str, message: str, next_state: str) -> dict[str, Any]:
    """A state that publishes one notification to the rollout's topic (``$.topicArn``); ``message`` is a
    ``States.Format`` expression. Not caught: a notification is the last word of its path."""
    return {"Type": "Task", "Resource": _sdk("sns", "publish"), "ResultPath": None, "Next": next_state,
            "Parameters": {"TopicArn.$": "$.topicArn", "Subject": subject, "Message.$": message}}


def _count_until_ready(read: str, service: str, action: str, parameters: dict[str, Any], *, count: str, ready: str,
                       selected: tuple[str, str], result_path: str, then: str, ready_timeout_s: int,
                       ) -> dict[str, Any]:
    """Three states of the wait for the new slot: ``read`` calls ``service:action`` and keeps the entries of one
    list (``selected``: the key to keep them under, the JSONPath filter that picks them), ``count`` counts them, and
    ``ready`` goes to ``then`` once there are as many as the old slot's desired capacity, to NewSlotNotReady (a roll
    back) once ``ready_timeout_s`` seconds are waited, else to WaitForNewSlot (which reads again)."""
    key, path = selected
    return {
        read: _task(service, action, parameters, count, result_selector={f"{key}.$": path}, result_path=result_path),
        count: {"Type": "Pass", "Parameters": {"count.$": f"States.ArrayLength({result_path}.{key})"},
                "ResultPath": result_path, "Next": ready},
        ready: {"Type": "Choice", "Choices": [
            {"Variable": f"{result_path}.count", "NumericGreaterThanEqualsPath": "$.oldCapacity.desired",
             "Next": then},
            {"Variable": "$.ready.waited", "NumericGreaterThanEquals": ready_timeout_s, "Next": "NewSlotNotReady"}],
            "Default": "WaitForNewSlot"},
    }


def _weights(old_percent: int) -> list[dict[str, Any]]:
    return [{"Type": "forward", "ForwardConfig": {"TargetGroups": [
        {"TargetGroupArn.$": "$.oldSlot.targetGroupArn", "Weight": old_percent},
        {"TargetGroupArn.$": "$.newSlot.targetGroupArn", "Weight": 100 - old_percent}]}}]


def _capacity(group: str, *, min_size: str | int, desired: str | int) -> dict[str, Any]:
    parameters: dict[str, Any] = {"AutoScalingGroupName.$": f"$.{group}.groupName"}
    for key, value in (("MinSize", min_size), ("DesiredCapacity", desired)):
        parameters[f"{key}.$" if isinstance(value, str) else key] = value
    return parameters


def rollout_definition(policy: RolloutPolicy, *, ready_timeout_s: int, warm_pool: bool = True) -> dict[str, Any]:
    """The Amazon States Language definition of a rollout (plain JSON: no tokens).

    Input: ``listenerArn``, ``topicArn``, ``minInstances``, ``lockName``, and ``oldSlot`` / ``newSlot`` each with
    ``name``, ``version``, ``groupName``, ``targetGroupArn`` and (new slot) ``alarmNames``. The states, in order:

    1. Refuse a second rollout: read the release that serves from the fleet's rollout-lock SSM parameter
       ``lockName``, then take the lock by deleting it (the parameter exists only while no rollout runs). Only one
       caller can delete a parameter; the next gets ``ParameterNotFound`` (Systems Manager API reference,
       DeleteParameter), so a second execution fails (notified) before it touches anything and two rollouts never
       interleave. The deploy checks the same parameter before it changes a launch template (``GpuInferenceFleet``:
       ``RolloutLockCheck``). Every end but a refusal puts the parameter back, with the release that serves then.
    1b. Refuse a version changed in place: when the release names the slot that serves with another version (one
       ``ModelArtifact`` edited instead of appended to the history, or an entry appended after a rollback), the
       deploy has just started an instance refresh of the serving slot to the new version. The execution rolls that
       refresh back at once (``RollbackInstanceRefresh``: the group returns to its previous launch template version
       and the new instances go before their launch hook lets them serve; EC2 Auto Scaling user guide, "Undo changes
       with a rollback"), says so on the topic, and fails ``InPlaceVersionChange``.
    2. Nothing to roll from: an old slot with no instances (the first deploy, or a redeploy after the rollout
       finished) ends the execution without moving traffic.
    3. Hold the old slot at its capacity (MinSize = its desired: scale-in may not shrink the place a rollback returns
       to), and bring the new slot to the same capacity once its own instance refresh (the new version's launch
       template, warm pool included) has finished: it launches through the warm pool and the launch hook, so an
       instance is in service only once its server answers (docs/gpu-inference-fleet.md, "Warm pool").
       With ``warm_pool``, first wait until the new slot's warm pool holds that many prepared, stopped instances
       (``DescribeWarmPool``, ``Warmed:Stopped``): the deploy has only just filled it.
    4. Wait until the new target group has that many healthy targets (at most ``ready_timeout_s``, else roll back).
    5. Each step: set the listener's weights, then bake, reading the new slot's alarms every ``alarm_poll``; an alarm
       in ALARM rolls back at once.
    6. After the last bake: the new slot keeps the fleet's minimum, the old slot scales to zero, a notification.

    Roll back: every request to the old slot (one ``ModifyListener``), the new slot to zero, (with ``warm_pool``)
    the old slot's warm pool back and the new slot's emptied (``PutWarmPool``: the template had given the pool to the
    new slot), a notification naming the alarms (or the error) and the execution fails, so its status says what
    happened.
    """
    bake_s = int(policy.bake.to_seconds())
    poll_s = int(policy.alarm_poll.to_seconds())
    ready_poll_s = int(READY_POLL.to_seconds())
    def release_lock(name: str, serving: str, next_state: str) -> dict[str, Any]:
        """Two states: record the release that serves (``serving``: "newSlot" or "oldSlot"), then put the lock back
        holding it."""
        return {
            f"Record{name}": {"Type": "Pass", "ResultPath": "$.serving", "Next": f"ReleaseLock{name}",
                              "Parameters": {"slot.$": f"$.{serving}.name", "version.$": f"$.{serving}.version"}},
            f"ReleaseLock{name}": {
                "Type": "Task", "Resource": _sdk("ssm", "putParameter"), "ResultPath": None, "Next": next_state,
                "Parameters": {"Name.$": "$.lockName", "Value.$": "States.JsonToString($.serving)",
                               "Type": "String", "Overwrite": True},
                "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 2, "MaxAttempts": 5, "BackoffRate": 2}]},
        }

    refuse = [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.lockError", "Next": "NotifyRefused"}]
    states: dict[str, Any] = {
        "ReadServingRelease": {
            "Type": "Task", "Resource": _sdk("ssm", "getParameter"), "Parameters": {"Name.$": "$.lockName"},
            "ResultSelector": {"release.$": "States.StringToJson($.Parameter.Value)"}, "ResultPath": "$.last",
            "Next": "TakeRolloutLock", "Catch": refuse},
        "TakeRolloutLock": {
            "Type": "Task", "Resource": _sdk("ssm", "deleteParameter"), "Parameters": {"Name.$": "$.lockName"},
            "ResultPath": None, "Next": "WasAVersionChangedInPlace",
            # No retry: ParameterNotFound means another rollout holds the lock; a throttled call refuses too, and
            # says so, having changed nothing.
            "Catch": refuse},
        "WasAVersionChangedInPlace": {"Type": "Choice", "Choices": [
            {"And": [{"Variable": "$.last.release.slot", "StringEqualsPath": "$.newSlot.name"},
                     {"Not": {"Variable": "$.last.release.version", "StringEqualsPath": "$.newSlot.version"}}],
             "Next": "UndoInPlaceRefresh"}],
            "Default": "ReadOldSlot"},
        "UndoInPlaceRefresh": {
            "Type": "Task", "Resource": _sdk("autoscaling", "rollbackInstanceRefresh"),
            "Parameters": {"AutoScalingGroupName.$": "$.newSlot.groupName"}, "ResultPath": None,
            "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 2, "MaxAttempts": 3, "BackoffRate": 2}],
            # A refresh that has already ended cannot be rolled back; say so in the notification.
            "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.undoError", "Next": "NotifyInPlace"}],
            "Next": "NotifyInPlace"},
        "NotifyInPlace": _notify(
            "Release refused: a version changed in place",
            "States.Format('Version {} was deployed to slot {}, which serves version {}: "
            "its instance refresh was rolled back, so the slot keeps serving {}. Ship a "
            "version by appending it to model_artifact (the release history), never by "
            "editing the serving entry (docs/rollouts.md).', $.newSlot.version, "
            "$.newSlot.name, $.last.release.version, $.last.release.version)",
            "ReleaseLockInPlace"),
        "ReleaseLockInPlace": {
            "Type": "Task", "Resource": _sdk("ssm", "putParameter"), "ResultPath": None, "Next": "RefusedInPlace",
            "Parameters": {"Name.$": "$.lockName", "Value.$": "States.JsonToString($.last.release)",
                           "Type": "String", "Overwrite": True},
            "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 2, "MaxAttempts": 5, "BackoffRate": 2}]},
        "RefusedInPlace": {"Type": "Fail", "Error": "InPlaceVersionChange",
                           "Cause": "The release changed the serving slot's version; its refresh was rolled back"},
        "NotifyRefused": _notify(
            "Rollout refused: another rollout is running",
            "States.Format('Rollout of {} to slot {} refused: another rollout of this "
            "fleet is running. Nothing was changed; deploy again once it has finished "
            "(or stop it: docs/rollouts.md).', $.newSlot.version, $.newSlot.name)",
            "Refused"),
        "Refused": {"Type": "Fail", "Error": "RolloutInProgress",
                    "Cause": "Another rollout of this fleet is running; this one changed nothing"},
        "ReadOldSlot": _task(
            "autoscaling", "describeAutoScalingGroups",
            {"AutoScalingGroupNames.$": "States.Array($.oldSlot.groupName)"},
            "AnythingToRollFrom", result_selector={"desired.$": "$.AutoScalingGroups[0].DesiredCapacity"},
            result_path="$.oldCapacity", catch=False),
        "AnythingToRollFrom": {"Type": "Choice", "Choices": [
            {"Variable": "$.oldCapacity.desired", "NumericGreaterThan": 0, "Next": "HoldOldSlot"}],
            "Default": "RecordNothingToRollFrom"},
        **release_lock("NothingToRollFrom", "newSlot", "NothingToRollFrom"),
        "NothingToRollFrom": {"Type": "Succeed", "Comment": "The old slot has no instances: no traffic to move"},
        "HoldOldSlot": _task("autoscaling", "updateAutoScalingGroup",
                             _capacity("oldSlot", min_size="$.oldCapacity.desired", desired="$.oldCapacity.desired"),
                             "StartReadyClock", catch=False),
        "StartReadyClock": {"Type": "Pass", "Result": {"waited": 0}, "ResultPath": "$.ready",
                            "Next": "NewSlotRefreshes"},
        "NewSlotRefreshes": _task(
            "autoscaling", "describeInstanceRefreshes", {"AutoScalingGroupName.$": "$.newSlot.groupName",
                                                         "MaxRecords": 1},
            "AnyRefresh", result_selector={"latest.$": "$.InstanceRefreshes"}, result_path="$.refresh"),
        # A comparison on a path that is absent fails the execution (States.Runtime), so presence is its own state.
        "AnyRefresh": {"Type": "Choice", "Choices": [
            {"Variable": "$.ready.waited", "NumericGreaterThanEquals": ready_timeout_s, "Next": "NewSlotNotReady"},
            {"Variable": "$.refresh.latest[0]", "IsPresent": False,
             "Next": "ReadNewSlotPool" if warm_pool else "ScaleUpNewSlot"}],
            "Default": "NewSlotRefreshed"},
        "NewSlotRefreshed": {"Type": "Choice", "Choices": [
            {"Or": [{"Variable": "$.refresh.latest[0].Status", "StringEquals": "Pending"},
                    {"Variable": "$.refresh.latest[0].Status", "StringEquals": "InProgress"}],
             "Next": "WaitForNewSlot"}],
            "Default": "ReadNewSlotPool" if warm_pool else "ScaleUpNewSlot"},
        "ScaleUpNewSlot": _task("autoscaling", "updateAutoScalingGroup",
                                _capacity("newSlot", min_size="$.oldCapacity.desired",
                                          desired="$.oldCapacity.desired"),
                                "ReadNewSlotHealth"),
        **_count_until_ready(
            "ReadNewSlotHealth", "elasticloadbalancingv2", "describeTargetHealth",
            {"TargetGroupArn.$": "$.newSlot.targetGroupArn"}, count="CountHealthy", ready="NewSlotReady",
            selected=("healthy", "$.TargetHealthDescriptions[?(@.TargetHealth.State == 'healthy')]"),
            result_path="$.health", then=f"Shift{policy.steps[0]}", ready_timeout_s=ready_timeout_s),
        "WaitForNewSlot": {"Type": "Wait", "Seconds": ready_poll_s, "Next": "TickReadyClock"},
        "TickReadyClock": {"Type": "Pass", "ResultPath": "$.ready", "Next": "AfterReadyTick",
                           "Parameters": {"waited.$": f"States.MathAdd($.ready.waited, {ready_poll_s})"}},
        "AfterReadyTick": {"Type": "Choice", "Choices": [
            {"Variable": "$.health", "IsPresent": True, "Next": "ReadNewSlotHealth"},
            *([{"Variable": "$.pool", "IsPresent": True, "Next": "ReadNewSlotPool"}] if warm_pool else [])],
            "Default": "NewSlotRefreshes"},
        "NewSlotNotReady": {"Type": "Pass", "ResultPath": "$.failure", "Next": "RollBack", "Result": {
            "Error": "NewSlotNotReady",
            "Cause": f"The new slot's targets were not all healthy within {ready_timeout_s} s"}},
    }
    for index, percent in enumerate(policy.steps):
        after = f"Shift{policy.steps[index + 1]}" if index + 1 < len(policy.steps) else "KeepNewSlotAtMinimum"
        states.update({
            f"Shift{percent}": _task("elasticloadbalancingv2", "modifyListener",
                                     {"ListenerArn.$": "$.listenerArn", "DefaultActions": _weights(100 - percent)},
                                     f"Bake{percent}Start"),
            f"Bake{percent}Start": {"Type": "Pass", "Result": {"waited": 0}, "ResultPath": "$.bake",
                                    "Next": f"Bake{percent}Alarms"},
            f"Bake{percent}Alarms": _task(
                "cloudwatch", "describeAlarms", {"AlarmNames.$": "$.newSlot.alarmNames", "StateValue": "ALARM"},
                # StateValue narrows the answer on AWS; the filter keeps the judgment right even where a
                # DescribeAlarms ignores StateValue beside AlarmNames (moto does).
                f"Bake{percent}Judge",
                result_selector={"names.$": "$.MetricAlarms[?(@.StateValue == 'ALARM')].AlarmName"},
                result_path="$.alarms"),
            f"Bake{percent}Judge": {"Type": "Choice", "Choices": [
                {"Variable": "$.alarms.names[0]", "IsPresent": True, "Next": "RollBack"},
                {"Variable": "$.bake.waited", "NumericGreaterThanEquals": bake_s, "Next": after}],
                "Default": f"Bake{percent}Wait"},
            f"Bake{percent}Wait": {"Type": "Wait", "Seconds": poll_s, "Next": f"Bake{percent}Tick"},
            f"Bake{percent}Tick": {"Type": "Pass", "ResultPath": "$.bake", "Next": f"Bake{percent}Alarms",
                                   "Parameters": {"waited.$": f"States.MathAdd($.bake.waited, {poll_s})"}},
        })
    states.update({
        "KeepNewSlotAtMinimum": _task("autoscaling", "updateAutoScalingGroup",
                                      {"AutoScalingGroupName.$": "$.newSlot.groupName", "MinSize.$": "$.minInstances"},
                                      "ScaleOldSlotToZero"),
        "ScaleOldSlotToZero": _task("autoscaling", "updateAutoScalingGroup",
                                    _capacity("oldSlot", min_size=0, desired=0), "NotifyDone", catch=False),
        "NotifyDone": _notify(
            "Rollout complete",
            "States.Format('Rollout complete: version {} (slot {}) serves every request; "
            "slot {} (version {}) scales to zero.', $.newSlot.version, $.newSlot.name, "
            "$.oldSlot.name, $.oldSlot.version)",
            "RecordDone"),
        **release_lock("Done", "newSlot", "Done"),
        "Done": {"Type": "Succeed"},
        # ---- Roll back: traffic first (one call), then capacity, then say why ------------------------------
        "RollBack": {
            "Type": "Task", "Resource": _sdk("elasticloadbalancingv2", "modifyListener"), "ResultPath": None,
            "Parameters": {"ListenerArn.$": "$.listenerArn", "DefaultActions": _weights(100)},
            "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 1, "MaxAttempts": 6, "BackoffRate": 2}],
            "Next": "HoldOldSlotAtMinimum"},
        "HoldOldSlotAtMinimum": {
            "Type": "Task", "Resource": _sdk("autoscaling", "updateAutoScalingGroup"), "ResultPath": None,
            "Parameters": {"AutoScalingGroupName.$": "$.oldSlot.groupName", "MinSize.$": "$.minInstances"},
            "Next": "ScaleNewSlotToZero"},
        "ScaleNewSlotToZero": {
            "Type": "Task", "Resource": _sdk("autoscaling", "updateAutoScalingGroup"), "ResultPath": None,
            "Parameters": _capacity("newSlot", min_size=0, desired=0),
            "Next": "GiveTheWarmPoolBack" if warm_pool else "WhyRolledBack"},
        "WhyRolledBack": {"Type": "Choice", "Choices": [
            {"Variable": "$.failure", "IsPresent": True, "Next": "NotifyRolledBackOnError"}],
            "Default": "NotifyRolledBackOnAlarm"},
        "NotifyRolledBackOnAlarm": _notify(
            "Rollout rolled back: an alarm fired",
            "States.Format('Rollout of {} (slot {}) rolled back: every request is on "
            "slot {} (version {}) again. In ALARM: {}.', $.newSlot.version, "
            "$.newSlot.name, $.oldSlot.name, $.oldSlot.version, "
            "States.JsonToString($.alarms.names))",
            "RecordAfterRollBack"),
        "NotifyRolledBackOnError": _notify(
            "Rollout rolled back: a step failed",
            "States.Format('Rollout of {} (slot {}) rolled back: every request is on "
            "slot {} (version {}) again. Failure: {}.', $.newSlot.version, "
            "$.newSlot.name, $.oldSlot.name, $.oldSlot.version, "
            "States.JsonToString($.failure))",
            "RecordAfterRollBack"),
        **release_lock("AfterRollBack", "oldSlot", "RolledBack"),
        "RolledBack": {"Type": "Fail", "Error": "RolledBack",
                       "Cause": "The new version was rolled back; the notification says why"},
    })
    if warm_pool:
        # The new slot's warm pool is filled by the deploy that names it live (the idle slot keeps none), each
        # instance launched, prepared (weights and image on its volume) and stopped under the launch hook; scaling
        # up before they are stopped and ready would launch cold (EC2 Auto Scaling user guide, "View warm pool
        # instance states": Warmed:Pending until the hook completes, then Warmed:Stopped). Wait for them.
        states.update(_count_until_ready(
            "ReadNewSlotPool", "autoscaling", "describeWarmPool", {"AutoScalingGroupName.$": "$.newSlot.groupName"},
            count="CountPooled", ready="NewSlotPoolReady",
            selected=("ready", "$.Instances[?(@.LifecycleState == 'Warmed:Stopped')]"), result_path="$.pool",
            then="ScaleUpNewSlot", ready_timeout_s=ready_timeout_s))
        # The deploy that started this rollout gave the new slot the warm pool and emptied the old one's
        # (GpuInferenceFleet: the idle slot keeps no stopped instances); a rollback swaps them back, so the slot that
        # serves again scales out warm and the failed version's stopped instances stop costing EBS.
        states.update({
            "GiveTheWarmPoolBack": {
                "Type": "Task", "Resource": _sdk("autoscaling", "putWarmPool"), "ResultPath": None,
                "Parameters": {"AutoScalingGroupName.$": "$.oldSlot.groupName", "MinSize": WARM_POOL_MIN_SIZE,
                               "MaxGroupPreparedCapacity": -1, "PoolState": "Stopped",
                               "InstanceReusePolicy": {"ReuseOnScaleIn": True}},
                "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 2, "MaxAttempts": 3, "BackoffRate": 2}],
                "Next": "EmptyTheNewSlotsWarmPool"},
            "EmptyTheNewSlotsWarmPool": {
                "Type": "Task", "Resource": _sdk("autoscaling", "putWarmPool"), "ResultPath": None,
                "Parameters": {"AutoScalingGroupName.$": "$.newSlot.groupName", "MinSize": 0,
                               "MaxGroupPreparedCapacity": 0, "PoolState": "Stopped",
                               "InstanceReusePolicy": {"ReuseOnScaleIn": True}},
                "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 2, "MaxAttempts": 3, "BackoffRate": 2}],
                "Next": "WhyRolledBack"},
        })
    return {"Comment": "Blue/green rollout of a model version (genai_constructs.fleets.rollout)",
            "StartAt": "ReadServingRelease", "TimeoutSeconds": int(STATE_MACHINE_TIMEOUT.to_seconds()),
            "States": states}


@dataclass(frozen=True)
class RolloutSlot:
    """What the state machine needs of one slot (tokens are fine)."""

    name: str
    version: str
    group_name: str
    target_group_arn: str
    alarm_names: tuple[str, ...]
    alarm_arns: tuple[str, ...]


class BlueGreenRollout(Construct):
    """The rollout state machine, its role (one customer-managed policy, exact ARNs where AWS has them) and its
    encrypted log group. ``execution_input(old, new)`` is what the deploy-time trigger starts it with."""

    def __init__(self, scope: Construct, id: str, *, policy: RolloutPolicy, state_machine_name: str,
                 listener_arn: str, slots: tuple[RolloutSlot, RolloutSlot], topic_arn: str, min_instances: int | str,
                 ready_timeout_s: int, encryption_key: kms.IKey, lock_parameter_name: str,
                 warm_pool: bool = True) -> None:
        super().__init__(scope, id)
        self.policy = policy
        self.definition = rollout_definition(policy, ready_timeout_s=ready_timeout_s, warm_pool=warm_pool)
        self._listener_arn, self._topic_arn, self._min_instances = listener_arn, topic_arn, min_instances
        self.lock_parameter_name = lock_parameter_name
        """The SSM parameter that exists only while no rollout runs (``rollout_definition``, step 1)."""
        self.lock_parameter_arn = (f"arn:{Aws.PARTITION}:ssm:{Aws.REGION}:{Aws.ACCOUNT_ID}:parameter"
                                   f"{lock_parameter_name}")
        self.state_machine_name = state_machine_name
        self.state_machine_arn = (f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}:stateMachine:"
                                  f"{state_machine_name}")
        self.log_group = logs.LogGroup(self, "Logs", retention=ROLLOUT_LOG_RETENTION, encryption_key=encryption_key,
                                       removal_policy=RemovalPolicy.RETAIN)
        group_arns = [f"arn:{Aws.PARTITION}:autoscaling:{Aws.REGION}:{Aws.ACCOUNT_ID}:autoScalingGroup:*:"
                      f"autoScalingGroupName/{slot.group_name}" for slot in slots]
        self.policy_document = iam.ManagedPolicy(self, "Policy", description=(
            f"{state_machine_name}: shift the listener's weights, size the two slots, read their alarms, notify"),
            statements=[
                iam.PolicyStatement(sid="ShiftWeights", actions=["elasticloadbalancing:ModifyListener"],
                                    resources=[listener_arn]),
                iam.PolicyStatement(sid="SizeSlots", actions=[
                    "autoscaling:UpdateAutoScalingGroup", "autoscaling:RollbackInstanceRefresh",
                    *(["autoscaling:PutWarmPool"] if warm_pool else [])],
                    resources=group_arns),
                iam.PolicyStatement(sid="ReadAlarms", actions=["cloudwatch:DescribeAlarms"],
                                    resources=[arn for slot in slots for arn in slot.alarm_arns]),
                iam.PolicyStatement(sid="Notify", actions=["sns:Publish"], resources=[topic_arn]),
                # Publishing to an SSE-KMS topic needs the key (Amazon SNS developer guide, "Encryption at rest":
                # publishers need kms:GenerateDataKey and kms:Decrypt); only through SNS.
                iam.PolicyStatement(sid="NotifyThroughTheTopicKey", actions=["kms:GenerateDataKey", "kms:Decrypt"],
                                    resources=[encryption_key.key_arn],
                                    conditions={"StringEquals": {"kms:ViaService": f"sns.{Aws.REGION}.amazonaws.com"}}),
                iam.PolicyStatement(sid="OneRolloutAtATime", actions=[
                    "ssm:GetParameter", "ssm:DeleteParameter", "ssm:PutParameter"],
                                    resources=[self.lock_parameter_arn]),
                iam.PolicyStatement(sid="ReadGroupsAndTargets", actions=[
                    "autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeInstanceRefreshes",
                    "autoscaling:DescribeWarmPool", "elasticloadbalancing:DescribeTargetHealth"], resources=["*"]),
                iam.PolicyStatement(sid="DeliverLogs", actions=[
                    "logs:CreateLogDelivery", "logs:GetLogDelivery", "logs:UpdateLogDelivery",
                    "logs:DeleteLogDelivery", "logs:ListLogDeliveries", "logs:PutResourcePolicy",
                    "logs:DescribeResourcePolicies", "logs:DescribeLogGroups"], resources=["*"]),
                iam.PolicyStatement(sid="Trace", actions=[
                    "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules",
                    "xray:GetSamplingTargets"], resources=["*"]),
            ])
        stack = Stack.of(self)
        group_refs = [stack.resolve(name) for name in (slot.group_name for slot in slots)]
        findings = {
            "AwsSolutions-IAM5[Resource::*]": (
                "autoscaling:DescribeAutoScalingGroups, autoscaling:DescribeInstanceRefreshes, "
                "autoscaling:DescribeWarmPool and elasticloadbalancing:DescribeTargetHealth have no resource-level "
                "permissions; the CloudWatch Logs "
                "delivery actions Step Functions logging needs and the X-Ray actions of tracing require Resource * "
                "(Step Functions developer guide, \"IAM policies for logging to CloudWatch Logs\")"),
        }
        for ref in group_refs:
            if isinstance(ref, dict) and "Ref" in ref:
                findings["AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:<AWS::Region>:"
                         f"<AWS::AccountId>:autoScalingGroup:*:autoScalingGroupName/<{ref['Ref']}>]"] = (
                    "An Auto Scaling group ARN embeds a UUID CloudFormation does not return; the group name pins it")
            elif isinstance(ref, str):
                findings["AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:<AWS::Region>:"
                         f"<AWS::AccountId>:autoScalingGroup:*:autoScalingGroupName/{ref}]"] = (
                    "An Auto Scaling group ARN embeds a UUID unknown before the group exists; the group name (fixed "
                    "at synthesis) pins it")
        _launch.acknowledge(self.policy_document, findings)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
                             managed_policies=[self.policy_document],
                             description=f"{state_machine_name}: the blue/green rollout state machine")
        self.state_machine = sfn.CfnStateMachine(
            self, "StateMachine", state_machine_name=state_machine_name, role_arn=self.role.role_arn,
            state_machine_type="STANDARD", definition_string=json.dumps(self.definition, sort_keys=True),
            logging_configuration=sfn.CfnStateMachine.LoggingConfigurationProperty(
                level="ALL", include_execution_data=True,
                destinations=[sfn.CfnStateMachine.LogDestinationProperty(
                    cloud_watch_logs_log_group=sfn.CfnStateMachine.CloudWatchLogsLogGroupProperty(
                        log_group_arn=self.log_group.log_group_arn))]),
            tracing_configuration=sfn.CfnStateMachine.TracingConfigurationProperty(enabled=True))

    def execution_input(self, old: RolloutSlot, new: RolloutSlot) -> str:
        """The JSON input the trigger starts the state machine with: traffic moves from ``old`` to ``new``."""
        return Stack.of(self).to_json_string(execution_input_document(
            listener_arn=self._listener_arn, topic_arn=self._topic_arn, min_instances=self._min_instances,
            lock_name=self.lock_parameter_name, old=old, new=new))


def execution_input_document(*, listener_arn: str, topic_arn: str, min_instances: int | str, lock_name: str,
                             old: RolloutSlot, new: RolloutSlot) -> dict[str, Any]:
    """The execution input ``rollout_definition`` reads (see its docstring): traffic moves from ``old`` to ``new``,
    judged by ``new``'s alarms."""
    def slot(s: RolloutSlot, alarms: bool) -> dict[str, Any]:
        value: dict[str, Any] = {"name": s.name, "version": s.version, "groupName": s.group_name,
                                 "targetGroupArn": s.target_group_arn}
        if alarms:
            value["alarmNames"] = list(s.alarm_names)
        return value
    return {"listenerArn": listener_arn, "topicArn": topic_arn, "minInstances": min_instances,
            "lockName": lock_name, "oldSlot": slot(old, False), "newSlot": slot(new, True)}
