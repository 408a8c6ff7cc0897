// Clip skip on SD 2.x, whose export already runs the tower's penultimate layer
// (model.json text_layers_used = layers - 1): --clip-skip N counts from the
// exported encoder's own output, so N = 2 skips one layer more (the tower's
// third-to-last), N = text_layers_used + 1 leaves the embeddings alone, and
// more is refused.
#include <gtest/gtest.h>

#include <torch/script.h>

#include "conformance_util.h"
#include "engine/stage_loader.h"
#include "sd/model_config.h"
#include "test_util.h"

namespace {

std::string model() { return sdtest::test_models() + "/tiny2-v-st"; }

// The encoder run by hand with its first `layers` layers, then the final LayerNorm.
at::Tensor by_hand(torch::jit::Module& te, const at::Tensor& ids, int layers) {
    auto tm = te.attr("text_model").toModule();
    auto emb = tm.attr("embeddings").toModule();
    const int64_t L = ids.size(1);
    at::Tensor x = emb.attr("token_embedding").toModule().forward({ids}).toTensor() +
                   emb.attr("position_embedding").toModule().attr("weight").toTensor().slice(0, 0, L).unsqueeze(0);
    const at::Tensor mask = at::full({L, L}, -INFINITY).triu(1);
    auto stack = tm.attr("encoder").toModule().attr("layers").toModule();
    for (int i = 0; i < layers; ++i) x = stack.attr(std::to_string(i)).toModule().forward({x, mask}).toTensor();
    return tm.attr("final_layer_norm").toModule().forward({x}).toTensor();
}

std::vector<std::string> args(const std::string& out, const std::string& clip_skip) {
    return {sdtest::cli(), "--model", model(), "--outdir", out, "--quiet", "--threads", "1", "--H", "64", "--W", "64",
            "--steps", "2", "--sampler", "ddim", "--prompt", "a red fox", "--clip-skip", clip_skip};
}

}  // namespace

TEST(Sd2ClipSkip, CountsFromTheExportedPenultimateLayer) {
    c10::InferenceMode guard;
    const auto config = sd::load_model_config(model());
    ASSERT_EQ(config.text_layers_used, 2);  // tiny2's tower has 3 layers; SD 2.x uses the penultimate
    auto te = sd::load_stage(model() + "/text_encoder.pt");
    const at::Tensor ids = sdtest::load_tensor(sdtest::fixtures() + "/tiny2/cases/p1_ddim10_v_64x64/tokens.npy");
    for (int n = 1; n <= 3; ++n) {  // A1111's numbering
        te.setattr("clip_skip", static_cast<int64_t>(n - 1));
        const at::Tensor got = te.forward({ids}).toTensor();
        EXPECT_LE(sdtest::max_abs_diff(got, by_hand(te, ids, 2 - (n - 1))), 1e-6) << "--clip-skip " << n;
        if (n == 1)  // unskipped: the reference's penultimate-layer conditioning
            EXPECT_LE(sdtest::max_abs_diff(got, sdtest::load_tensor(sdtest::fixtures() + "/tiny2/cases/p1_ddim10_v_64x64/cond.npy")), 1e-4);
    }
}

TEST(Sd2ClipSkip, CliRunsWithinRangeAndRefusesBeyond) {
    const std::string a = sdtest::temp_dir(), b = sdtest::temp_dir();
    const auto one = sdtest::run(args(a, "1")), two = sdtest::run(args(b, "2"));
    ASSERT_EQ(one.exit_code, 0) << one.err;
    ASSERT_EQ(two.exit_code, 0) << two.err;
    EXPECT_NE(sdtest::read_text(sdtest::lines(one.out).at(0)), sdtest::read_text(sdtest::lines(two.out).at(0)));
    const auto beyond = sdtest::run(args(sdtest::temp_dir(), "4"));
    EXPECT_EQ(beyond.exit_code, 1);
    EXPECT_EQ(sdtest::lines(beyond.err).size(), 1u) << beyond.err;
    EXPECT_NE(beyond.err.find("the largest clip skip is 3"), std::string::npos) << beyond.err;
}
