"""Offline checks of Dataflow flags: each failure is one line naming the value.

Nothing here touches the network. Beam falls back to network calls (default
bucket creation, `gcloud` for a region) when these values are missing or
malformed, so they are checked before Beam sees them.
"""

from __future__ import annotations

import re

_PROJECT_RE = re.compile(r"^(?:[a-z0-9][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]\Z")
_REGION_RE = re.compile(r"^[a-z]+(?:-[a-z]+)+[0-9]+\Z")
_ZONE_RE = re.compile(r"^[a-z]+(?:-[a-z]+)+[0-9]+-[a-z]\Z")
_BUCKET_RE = re.compile(r"^[a-z0-9][-_.a-z0-9]*[a-z0-9]\Z")
_GS_RE = re.compile(r"^gs://([^/]*)(?:/(.*))?$", re.DOTALL)
_JOB_NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]*[a-z0-9])?\Z")
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+\Z")
_SUBNETWORK_RE = re.compile(
    r"(?:^|/)regions/([a-z0-9-]+)/subnetworks/[a-z](?:[-a-z0-9]*[a-z0-9])?\Z")


class FlagError(ValueError):
  """A Dataflow flag is missing or malformed; the message is one line."""


def require(value, flag: str, example: str) -> None:
  if value is None or (isinstance(value, str) and not value.strip()):
    raise FlagError(f"{flag} is required (e.g. {flag} {example}).")


def project(value: str) -> str:
  """A Google Cloud project id such as 'my-project' (not its number or name)."""
  if value.isdigit():
    raise FlagError(f"--project {value!r} is a project number; give the project id "
                    "(e.g. --project my-project; see `gcloud projects list`).")
  if not _PROJECT_RE.match(value):
    raise FlagError(f"--project {value!r} is not a valid project id: 6-30 characters of "
                    "lowercase letters, digits and hyphens, starting with a letter "
                    "(e.g. --project my-project).")
  return value


def region(value: str) -> str:
  """A Dataflow region such as 'us-central1'."""
  if _ZONE_RE.match(value):
    raise FlagError(f"--region {value!r} is a zone; give its region (e.g. --region "
                    f"{value.rsplit('-', 1)[0]}) and, to pin workers to the zone, "
                    f"--worker_zone {value}.")
  if not _REGION_RE.match(value):
    raise FlagError(f"--region {value!r} is not a Google Cloud region "
                    "(e.g. us-central1, europe-west4, asia-northeast1).")
  return value


def gcs_path(value: str, flag: str, *, need_object: bool, example: str) -> str:
  """A gs://bucket[/object] URI with a valid bucket name."""
  m = _GS_RE.match(value)
  if not m:
    raise FlagError(f"{flag} must be a Cloud Storage path gs://BUCKET/..., got {value!r} "
                    f"(e.g. {flag} {example}).")
  bucket, obj = m.group(1), m.group(2) or ""
  if "\n" in value or "\r" in value:  # Cloud Storage names cannot hold them (a pasted line end, say).
    raise FlagError(f"{flag} {value!r} holds a line break, which no Cloud Storage name can; "
                    f"remove it (e.g. {flag} {example}).")
  if not (3 <= len(bucket) <= (222 if "." in bucket else 63)) or not _BUCKET_RE.match(bucket):
    raise FlagError(f"{flag} {value!r} names the bucket {bucket!r}, which is not a valid "
                    "bucket name: 3-63 characters of lowercase letters, digits, '-', '_' "
                    "and '.', starting and ending with a letter or digit.")
  if need_object and not obj.strip("/"):
    raise FlagError(f"{flag} {value!r} needs a folder inside the bucket "
                    f"(e.g. {flag} gs://{bucket}/tmp).")
  return value


def input_pattern(value: str) -> str:
  if not value.startswith("gs://"):
    raise FlagError(f"--input {value!r} is not on Cloud Storage; Dataflow workers read "
                    "only gs:// paths. Copy the shards first (gcloud storage cp -r DIR "
                    "gs://BUCKET/tfr/) or convert locally with `python -m pipelines.convert`.")
  return gcs_path(value, "--input", need_object=True, example="'gs://my-bucket/tfr/train-*'")


def tfds_dataset_dir(value: str) -> str:
  """A TFDS dataset version folder on Cloud Storage."""
  if not value.startswith("gs://"):
    raise FlagError(f"--tfds-dataset-dir {value!r} is not on Cloud Storage; Dataflow workers "
                    "read only gs:// paths. Copy the dataset first (gcloud storage cp -r "
                    "~/tensorflow_datasets/NAME gs://BUCKET/tensorflow_datasets/) or convert "
                    "locally with `arrayrecord-tfds`.")
  return gcs_path(value, "--tfds-dataset-dir", need_object=True,
                  example="gs://my-bucket/tensorflow_datasets/mnist/3.0.1").rstrip("/")


def job_name(value: str) -> str:
  if not _JOB_NAME_RE.match(value) or len(value) > 1024:
    suggestion = re.sub(r"[^-a-z0-9]+", "-", value.lower()).strip("-") or "arrayrecord-convert"
    if not suggestion[0].isalpha():
      suggestion = "job-" + suggestion
    raise FlagError(f"--job_name {value!r} is not valid: use lowercase letters, digits and "
                    f"'-', starting with a letter and ending with a letter or digit "
                    f"(e.g. --job_name {suggestion}).")
  return value


def service_account(value: str) -> str:
  if not _EMAIL_RE.match(value):
    raise FlagError(f"--service_account_email {value!r} is not an email address "
                    "(e.g. --service_account_email worker@my-project.iam.gserviceaccount.com).")
  return value


def subnetwork(value: str, job_region: str, worker_region: str | None = None) -> str:
  """'regions/R/subnetworks/S' or the full URL; its region must be the workers' (the job's by default)."""
  where = worker_region or job_region
  m = _SUBNETWORK_RE.search(value)
  if not m:
    raise FlagError(f"--subnetwork {value!r} is not a subnetwork path: use "
                    f"regions/{where}/subnetworks/NAME or https://www.googleapis.com/"
                    f"compute/v1/projects/HOST_PROJECT/regions/{where}/subnetworks/NAME.")
  if m.group(1) != where:
    runs = (f"the workers run in {where!r} (--worker_region / --worker_zone)" if worker_region
            else f"the job runs in --region {job_region!r}")
    raise FlagError(f"--subnetwork {value!r} is in region {m.group(1)!r} but {runs}; use a subnetwork "
                    f"of {where} (or set --worker_region {m.group(1)}).")
  return value


def network(value: str) -> str:
  if not value.strip() or any(c.isspace() for c in value):
    raise FlagError(f"--network {value!r} is not a VPC network name (e.g. --network default).")
  return value


def positive(value: int | None, flag: str) -> int | None:
  if value is not None and value < 1:
    raise FlagError(f"{flag} must be a positive number of workers, got {value}.")
  return value


_MACHINE_TYPE_RE = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)+\Z")
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}\Z")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}\Z")


def machine_type(value: str) -> str:
  """A Compute Engine machine type such as 'n2-standard-4' or 'custom-4-16384'."""
  if not _MACHINE_TYPE_RE.match(value):
    hint = f" (machine types are lower case: {value.lower()!r})" if _MACHINE_TYPE_RE.match(value.lower()) else ""
    raise FlagError(f"--machine_type {value!r} is not a machine type{hint}; e.g. --machine_type n2-standard-4.")
  return value


def container_image(value: str) -> str:
  if not value.strip() or any(c.isspace() for c in value):
    raise FlagError(f"--sdk_container_image {value!r} is not a container image path "
                    "(e.g. us-docker.pkg.dev/my-project/images/beam-worker:1.0).")
  return value


def worker_zone(value: str) -> str:
  if not _ZONE_RE.match(value):
    example = f"{value}-b" if _REGION_RE.match(value) else "us-central1-b"
    what = "a region" if _REGION_RE.match(value) else "not a zone"
    raise FlagError(f"--worker_zone {value!r} is {what}; give a zone (e.g. --worker_zone {example}), "
                    "or a region with --worker_region.")
  return value


def worker_region(value: str) -> str:
  if _ZONE_RE.match(value):
    raise FlagError(f"--worker_region {value!r} is a zone; give --worker_region {value.rsplit('-', 1)[0]}, "
                    f"or --worker_zone {value} to pin the workers to that zone.")
  if not _REGION_RE.match(value):
    raise FlagError(f"--worker_region {value!r} is not a Google Cloud region (e.g. us-central1).")
  return value


def labels(values: list[str]) -> list[str]:
  """Beam's --labels KEY=VALUE: Google Cloud label rules (lower case, digits, '_' and '-')."""
  for item in values:
    key, _, value = item.partition("=")
    if not _LABEL_KEY_RE.match(key) or not _LABEL_VALUE_RE.match(value):
      raise FlagError(f"--labels {item!r} is not a valid label: keys start with a lower-case letter, and "
                      "keys and values hold at most 63 lower-case letters, digits, '_' or '-' "
                      "(e.g. --labels team=ml-research).")
  return values


def positive_int(value: str | None, flag: str) -> str | None:
  """A Beam pass-through flag that must be a positive integer (Beam accepts any int)."""
  if value is None:
    return None
  try:
    number = int(value)
  except ValueError:
    number = 0
  if number < 1:
    raise FlagError(f"{flag} must be a positive integer, got {value!r}.")
  return value
