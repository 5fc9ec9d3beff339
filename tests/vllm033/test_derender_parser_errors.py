"""tests/app/vllm/test_derender_parser_errors.py on vLLM 0.33's modules: there our batch derender is
0.33's own OnlineDerenderer (which lets its parser's exceptions through, as coupled chat does), our
stream our stage; both answer 0.33's coupled chat's status with a reason."""

import pytest

from tests.app.vllm.test_derender_parser_errors import test_a_parser_exception_is_vllms_status_with_a_reason  # noqa: F401 (collected here)

pytestmark = pytest.mark.anyio
