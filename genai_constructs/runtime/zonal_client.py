"""Zone-local endpoint ordering for code running on the instances (standard library only).

The retrieval tier's latency variance is on the critical path: a cross-AZ hop adds latency and its tail, and
costs per GB. On an instance, learn the AZ from IMDSv2, order an endpoint's DNS names own-AZ first, and fail over
to other zones only when the local one fails::

    from genai_constructs.runtime.zonal_client import ZonalClient

    client = ZonalClient.from_dns_entries(os.environ["RETRIEVAL_DNS_ENTRIES"])   # PrivateDataPath.dns_entries(...)
    result = client.call(lambda host: search(f"https://{host}/query", ...))

The DNS entries are what ``PrivateDataPath.dns_entries(name)`` resolves to at deploy time: CloudFormation's
``DnsEntries`` of a VPC endpoint (``"hostedzone:dnsname"`` items) or an internal NLB's names; zonal names carry
their AZ (``vpce-0a1-b2c-us-east-1a.sqs.us-east-1.vpce.amazonaws.com``, ``us-east-1a.my-nlb-1.elb...``).
"""

from __future__ import annotations

import logging
import math
import re
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "Answered",
    "DEFAULT_IMDS_TIMEOUT_S",
    "IMDS_BASE_URL",
    "FailoverExhaustedError",
    "ZoneLookupError",
    "ZonalClient",
    "ZonalEndpoints",
    "availability_zone",
    "call_with_failover",
    "call_with_failover_async",
    "zone_of",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The instance metadata service's address on every EC2 instance (Nitro and Xen alike).
IMDS_BASE_URL = "http://169.254.169.254"
# IMDS answers in milliseconds on an instance; one second bounds the wait when run off EC2 (laptops, CI).
DEFAULT_IMDS_TIMEOUT_S = 1.0
# Six hours, the IMDSv2 maximum: one token serves every lookup this process makes.
IMDS_TOKEN_TTL_S = 21600

# An AZ name as the last dash-separated part of a DNS name's first label, or the whole label:
# "vpce-0a1-b2c-us-east-1a" -> "us-east-1a", "us-east-1a" (NLB zonal name) -> "us-east-1a",
# "us-gov-west-1b", "ap-southeast-2c"; a Local Zone like "us-east-1-bos-1a" too.
_AZ_IN_LABEL = re.compile(r"(?:^|-)((?:[a-z]{2})(?:-gov)?-[a-z]+-\d+(?:-[a-z]{3}-\d+)?[a-z])$")


class ZoneLookupError(RuntimeError):
    """IMDSv2 did not tell this process its availability zone (not on EC2, IMDS disabled, or hop limit)."""


class FailoverExhaustedError(RuntimeError):
    """Every endpoint failed; ``errors`` pairs each endpoint tried with its exception, in order."""

    def __init__(self, errors: Sequence[tuple[str, BaseException]]) -> None:
        self.errors = list(errors)
        tried = "; ".join(f"{host}: {type(e).__name__}: {e}" for host, e in self.errors)
        super().__init__(f"all {len(self.errors)} endpoint(s) failed: {tried}")


def _check_imds_settings(base_url: object, timeout_s: object, *, url_name: str, timeout_name: str) -> None:
    """A bad base URL or timeout is the caller's mistake, raised at once: inside the lookup it would read as "not on
    EC2" (a ZoneLookupError, then a silent loss of the zone preference)."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"{url_name}={base_url!r} is not an http(s) URL; give e.g. {url_name}={IMDS_BASE_URL!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) \
            or timeout_s <= 0:
        raise ValueError(f"{timeout_name}={timeout_s!r} is not a finite number of seconds greater than 0; give e.g. "
                         f"{timeout_name}={DEFAULT_IMDS_TIMEOUT_S}")


def availability_zone(*, base_url: str = IMDS_BASE_URL, timeout_s: float = DEFAULT_IMDS_TIMEOUT_S) -> str:
    """This instance's AZ name (e.g. ``us-east-1a``) from IMDSv2: PUT a session token, then GET the placement.

    :raises ValueError: ``base_url`` is not an http(s) URL, or ``timeout_s`` is not a finite number above 0.
    :raises ZoneLookupError: IMDS unreachable, timed out, refused the token, or answered something not an AZ.
    """
    _check_imds_settings(base_url, timeout_s, url_name="base_url", timeout_name="timeout_s")
    try:
        put = urllib.request.Request(
            f"{base_url}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_S)},
        )
        with urllib.request.urlopen(put, timeout=timeout_s) as response:
            token: str = response.read().decode().strip()
        get = urllib.request.Request(
            f"{base_url}/latest/meta-data/placement/availability-zone", headers={"X-aws-ec2-metadata-token": token}
        )
        with urllib.request.urlopen(get, timeout=timeout_s) as response:
            zone: str = response.read().decode().strip()
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise ZoneLookupError(f"IMDSv2 at {base_url} gave no availability zone: {error}") from error
    if zone_of(zone) != zone:
        raise ZoneLookupError(f"IMDSv2 at {base_url} answered {zone!r}, which is not an availability zone name")
    return zone


def zone_of(dns_name: str) -> str | None:
    """The AZ a zonal DNS name belongs to, or None for a regional (any-zone) name."""
    first_label = dns_name.strip().rstrip(".").split(".", 1)[0].lower()
    match = _AZ_IN_LABEL.search(first_label)
    return str(match.group(1)) if match else None


def _names(entries: str | Iterable[str]) -> list[str]:
    items = entries.split(",") if isinstance(entries, str) else list(entries)
    names: list[str] = []
    for item in items:
        name = item.strip().rsplit(":", 1)[-1].strip()  # "Z7HUB22UULQXV:vpce-..." -> "vpce-..."
        if name and name not in names:
            names.append(name)
    return names


@dataclass(frozen=True)
class ZonalEndpoints:
    """An endpoint's DNS names grouped by AZ; names without an AZ are regional (DNS picks any zone)."""

    zonal: Mapping[str, tuple[str, ...]]
    regional: tuple[str, ...] = ()

    @classmethod
    def from_dns_entries(cls, entries: str | Iterable[str]) -> ZonalEndpoints:
        """Parse ``PrivateDataPath.dns_entries(...)`` as resolved at deploy time (a comma-separated string) or a list
        of names; ``"hostedzone:dnsname"`` items lose their hosted zone."""
        zonal: dict[str, list[str]] = {}
        regional: list[str] = []
        for name in _names(entries):
            zone = zone_of(name)
            if zone is None:
                regional.append(name)
            else:
                zonal.setdefault(zone, []).append(name)
        if not zonal and not regional:
            raise ValueError(f"no DNS names in {entries!r}: pass PrivateDataPath.dns_entries(...) as deployed")
        return cls(zonal={z: tuple(n) for z, n in sorted(zonal.items())}, regional=tuple(regional))

    def ordered(self, own_zone: str | None) -> list[str]:
        """Own-AZ names first, then the other zones' (in AZ order, for a stable failover path), regional last.

        Regional names come last: they resolve to any zone, so they are the fallback, never the preference.
        """
        names = list(self.zonal.get(own_zone, ())) if own_zone else []
        for zone, zone_names in self.zonal.items():
            if zone != own_zone:
                names.extend(zone_names)
        names.extend(self.regional)
        return names


def call_with_failover(
    endpoints: Sequence[str],
    call: Callable[[str], T],
    *,
    retry_on: tuple[type[BaseException], ...] = (OSError,),
) -> T:
    """Call ``call(endpoint)`` on each endpoint in order and return the first success.

    Moves to the next endpoint only when ``call`` raises one of ``retry_on`` (``OSError`` covers refused
    connections, timeouts, DNS failures and ``urllib.error.URLError``); any other exception propagates at once,
    since a bad request fails the same way in every zone.

    :raises FailoverExhaustedError: every endpoint failed.
    """
    if not endpoints:
        raise ValueError("endpoints is empty: nothing to call")
    errors: list[tuple[str, BaseException]] = []
    for endpoint in endpoints:
        try:
            result = call(endpoint)
        except retry_on as error:
            log.warning("endpoint %s failed (%s: %s); trying the next zone", endpoint, type(error).__name__, error)
            errors.append((endpoint, error))
            continue
        if errors:
            log.info("endpoint %s answered after %d failure(s)", endpoint, len(errors))
        return result
    raise FailoverExhaustedError(errors)


@dataclass(frozen=True)
class Answered(Generic[T]):
    """What an asyncio call with failover returned, and which endpoint gave it after which failures."""

    value: T
    endpoint: str
    failures: tuple[tuple[str, BaseException], ...] = ()


async def call_with_failover_async(
    endpoints: Sequence[str],
    call: Callable[[str], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...] = (OSError,),
) -> Answered[T]:
    """:func:`call_with_failover` for coroutines, telling which endpoint answered (the caller logs local/failover).

    :raises FailoverExhaustedError: every endpoint failed.
    """
    if not endpoints:
        raise ValueError("endpoints is empty: nothing to call")
    errors: list[tuple[str, BaseException]] = []
    for endpoint in endpoints:
        try:
            value = await call(endpoint)
        except retry_on as error:
            log.warning("endpoint %s failed (%s: %s); trying the next zone", endpoint, type(error).__name__, error)
            errors.append((endpoint, error))
            continue
        return Answered(value, endpoint, tuple(errors))
    raise FailoverExhaustedError(errors)


@dataclass
class ZonalClient:
    """An endpoint's names ordered own-AZ first, with failover. The AZ is looked up once (IMDSv2) and kept.

    When IMDS cannot be reached (not on EC2) the client still works, with no zone preferred.
    """

    endpoints: ZonalEndpoints
    own_zone: str | None = None
    imds_base_url: str = IMDS_BASE_URL
    imds_timeout_s: float = DEFAULT_IMDS_TIMEOUT_S
    retry_on: tuple[type[BaseException], ...] = (OSError,)
    _looked_up: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_imds_settings(self.imds_base_url, self.imds_timeout_s, url_name="imds_base_url",
                             timeout_name="imds_timeout_s")

    @classmethod
    def from_dns_entries(cls, entries: str | Iterable[str], **options: object) -> ZonalClient:
        return cls(ZonalEndpoints.from_dns_entries(entries), **options)  # type: ignore[arg-type]

    @property
    def zone(self) -> str | None:
        if self.own_zone is None and not self._looked_up:
            self._looked_up = True
            try:
                self.own_zone = availability_zone(base_url=self.imds_base_url, timeout_s=self.imds_timeout_s)
            except ZoneLookupError as error:
                log.warning("no zone preference: %s", error)
        return self.own_zone

    def ordered(self) -> list[str]:
        return self.endpoints.ordered(self.zone)

    def call(self, call: Callable[[str], T]) -> T:
        return call_with_failover(self.ordered(), call, retry_on=self.retry_on)

    def is_local(self, endpoint: str) -> bool:
        """Whether ``endpoint`` is one of this client's own zone's (False when no zone is known)."""
        zone = self.zone
        return zone is not None and endpoint in self.endpoints.zonal.get(zone, ())

    async def call_async(self, call: Callable[[str], Awaitable[T]], *, avoid: Iterable[str] = ()) -> Answered[T]:
        """Own-AZ first with failover, for coroutines; endpoints in ``avoid`` (recently failed) go last, still tried
        when everything else fails."""
        avoided = set(avoid)
        ordered = self.ordered()
        ordered = [e for e in ordered if e not in avoided] + [e for e in ordered if e in avoided]
        return await call_with_failover_async(ordered, call, retry_on=self.retry_on)
