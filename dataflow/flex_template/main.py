"""Flex Template entry point: FLEX_TEMPLATE_PYTHON_PY_FILE in the Dockerfile.

The launcher runs this file with the template's parameters (metadata.json)
and the job's Dataflow options as flags (--project, --region,
--temp_location, --template_location, ...); `dataflow.submit` takes them all.
"""

import sys

from dataflow import submit

if __name__ == "__main__":
  sys.exit(submit.main())
