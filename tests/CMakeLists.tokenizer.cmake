# CLIP tokenizer tests (no LibTorch). Included from tests/CMakeLists.txt.
find_package(GTest REQUIRED)
include(GoogleTest)

add_executable(test_tokenizer ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.cpp)
target_link_libraries(test_tokenizer PRIVATE sd_base GTest::gtest_main)
target_compile_definitions(test_tokenizer PRIVATE
  SD_TOKENIZER_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures/tokenizer"
  SD_CLIP_MODEL_DIR="${CMAKE_SOURCE_DIR}/models/clip"
  SD_TEST_DATA_DIR="${CMAKE_SOURCE_DIR}/tests/data"
  # Optional: the shared conformance set next to the checkout (skipped if absent).
  SD_SHARED_CONFORMANCE_DIR="${CMAKE_SOURCE_DIR}/../shared/conformance"
)
gtest_discover_tests(test_tokenizer DISCOVERY_MODE PRE_TEST)
