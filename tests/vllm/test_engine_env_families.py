"""What vLLM and the libraries it runs read reaches vLLM's environment; what is withheld is said
once (issue 30, finding 10).

The allow-list withheld, silently, the proxy variables (both cases), the CA bundle variables
(multimodal URL fetches behind a proxy or a private CA), OpenTelemetry's OTEL_* (vLLM's tracing),
tiktoken's TIKTOKEN_* (offline gpt-oss) and the compilers' CPATH, LIBRARY_PATH and NVCC_*.
"""

from __future__ import annotations

import json

from helpers.run import base_env, run_warmstart
from warmstart.engine.process import engine_environment

READ_BY_VLLM_AND_ITS_LIBRARIES = {
    "HTTP_PROXY": "http://proxy.internal:3128",
    "HTTPS_PROXY": "http://proxy.internal:3128",
    "NO_PROXY": "localhost,127.0.0.1",
    "http_proxy": "http://proxy.internal:3128",
    "https_proxy": "http://proxy.internal:3128",
    "no_proxy": "localhost,127.0.0.1",
    "ALL_PROXY": "socks5://proxy.internal:1080",
    "SSL_CERT_FILE": "/etc/ssl/private-ca.pem",
    "SSL_CERT_DIR": "/etc/ssl/certs",
    "REQUESTS_CA_BUNDLE": "/etc/ssl/private-ca.pem",
    "CURL_CA_BUNDLE": "/etc/ssl/private-ca.pem",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317",
    "OTEL_SERVICE_NAME": "vllm",
    "TIKTOKEN_RS_CACHE_DIR": "/runpod-volume/tiktoken",
    "TIKTOKEN_ENCODINGS_BASE": "/runpod-volume/tiktoken-encodings",
    "CPATH": "/usr/local/cuda/include",
    "LIBRARY_PATH": "/usr/local/cuda/lib64/stubs",
    "NVCC_APPEND_FLAGS": "-allow-unsupported-compiler",
}


def test_the_families_vllm_reads_reach_its_environment():
    env = engine_environment({**READ_BY_VLLM_AND_ITS_LIBRARIES, "AWS_SECRET_ACCESS_KEY": "s"}, {})
    missing = sorted(set(READ_BY_VLLM_AND_ITS_LIBRARIES) - set(env))
    assert not missing, f"withheld from vLLM: {missing}"
    assert "AWS_SECRET_ACCESS_KEY" not in env


def test_a_boot_says_in_one_line_which_variables_it_withheld(tmp_path, volume, tiny_model, fake_vllm_python):
    envfile = tmp_path / "vllm-env.json"
    env = base_env(
        volume,
        fake_vllm_python,
        tmp_path,
        **READ_BY_VLLM_AND_ITS_LIBRARIES,
        FAKE_VLLM_ENVFILE=str(envfile),
        MYAPP_FEATURE_FLAG="on",
        MYAPP_DB_PASSWORD="hunter2-not-for-vllm",
        WARMSTART_LOCAL_CACHE=str(tmp_path / "local"),
    )
    result = run_warmstart(["boot", "--json"], env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    given = json.loads(envfile.read_text())
    assert {k: given.get(k) for k in READ_BY_VLLM_AND_ITS_LIBRARIES} == READ_BY_VLLM_AND_ITS_LIBRARIES
    assert "MYAPP_FEATURE_FLAG" not in given and "MYAPP_DB_PASSWORD" not in given
    (line,) = [x for x in result.stderr.splitlines() if "not passed to vLLM" in x]
    assert "MYAPP_FEATURE_FLAG" in line and "WARMSTART_VLLM_ENV" in line
    assert "MYAPP_DB_PASSWORD" not in line, "a secret's name is not listed (nor its value, anywhere)"
    assert "hunter2" not in result.stderr + result.stdout
    assert not any(name in line for name in READ_BY_VLLM_AND_ITS_LIBRARIES)
