"""arrayrecord-toolkit: TFRecord -> ArrayRecord conversion on Beam, and a loader for JAX."""
import pathlib

import setuptools

_HERE = pathlib.Path(__file__).parent


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
    # Workers on Dataflow install exactly this: never TensorFlow.
    install_requires=_requirements(),
    extras_require={
        "gcp": ["apache-beam[gcp]>=2.77.0"],
        "tfds": ["tensorflow>=2.16", "tensorflow-datasets>=4.9.6"],
        "jax": ["jax>=0.4.30"],
        "orbax": ["orbax-checkpoint>=0.11"],
        "dev": [
            "pytest>=8",
            "pytest-timeout",
            "psutil",
            "tensorflow-cpu>=2.16",
            "tensorflow-datasets>=4.9.6",
            "grain==0.2.18",
            "jax>=0.4.30",
            "orbax-checkpoint>=0.11",
            "apache-beam[gcp]>=2.77.0",
            "gcp-storage-emulator",
            "matplotlib",
            "build",
        ],
    },
    entry_points={
        "console_scripts": [
            "arrayrecord-convert=pipelines.convert:main",
            "arrayrecord-verify=pipelines.verify:main",
            "arrayrecord-tfds=pipelines.tfds_convert:main",
            "arrayrecord-dataflow=dataflow.submit:main",
        ],
    },
)
