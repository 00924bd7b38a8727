"""arrayrecord-toolkit: TFRecord -> ArrayRecord conversion on Beam, and a loader for JAX."""
import pathlib

import setuptools

_HERE = pathlib.Path(__file__).parent
# The Beam minor that dataflow/beam_internals.py (TESTED_BEAM_VERSION) and the
# Flex Template's SDK image were checked against: the Dataflow submitter uses
# Beam internals that a new minor may move, so a fresh install stays on it.
_BEAM_VERSIONS = ">=2.77.0,<2.78"
_BEAM = f"apache-beam{_BEAM_VERSIONS}"
_BEAM_GCP = f"apache-beam[gcp]{_BEAM_VERSIONS}"


def _requirements() -> list[str]:
  lines = (_HERE / "requirements.txt").read_text().splitlines()
  return [l.split("#")[0].strip() for l in lines if l.split("#")[0].strip()]


setuptools.setup(
    name="arrayrecord-toolkit",
    version="0.1.0",
    description=(
        "Convert sharded TFRecord datasets to matched ArrayRecord shards on "
        "Apache Beam (DirectRunner or Dataflow) and load them globally "
        "shuffled and checkpointable into JAX."
    ),
    long_description=(_HERE / "README.md").read_text() if (_HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["converter", "converter.*", "loader", "loader.*", "pipelines", "pipelines.*", "dataflow", "dataflow.*"]),
    package_data={"dataflow": ["flex_template/*"]},
    include_package_data=True,
    # The lean install: what `import loader` needs. Workers on Dataflow install
    # exactly this with the staged sdist (their container has Beam): never TensorFlow.
    install_requires=_requirements(),
    extras_require={
        # The converter and its CLIs (arrayrecord-convert, -verify, -tfds).
        "beam": [_BEAM],
        # arrayrecord-dataflow and gs:// paths: Beam with its Google Cloud clients.
        "gcp": [_BEAM_GCP],
        "tfds": ["tensorflow>=2.16", "tensorflow-datasets>=4.9.6"],
        "jax": ["jax>=0.4.30"],
        "orbax": ["orbax-checkpoint>=0.11"],
        # loader.experimental.ParquetIterDataset.
        "parquet": ["pyarrow>=14"],
        "dev": [
            "pytest>=8",
            "pytest-timeout",
            "psutil",
            "tensorflow-cpu>=2.16",
            "tensorflow-datasets>=4.9.6",
            "grain==0.2.18",
            "jax>=0.4.30",
            "keras>=3.9",  # Its model.fit takes Grain datasets (tests/test_loader_keras.py).
            "orbax-checkpoint>=0.11",
            "pyarrow>=14",
            _BEAM_GCP,
            "gcp-storage-emulator",
            "matplotlib",
            "build",
        ],
    },
    entry_points={
        "console_scripts": [
            # Through a launcher that names the extra to install when Beam is missing.
            "arrayrecord-convert=pipelines.entry_points:convert",
            "arrayrecord-verify=pipelines.entry_points:verify",
            "arrayrecord-tfds=pipelines.entry_points:tfds",
            "arrayrecord-dataflow=pipelines.entry_points:dataflow",
        ],
    },
)
