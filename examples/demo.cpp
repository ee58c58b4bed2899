// A one-minute demo: the same small MLP trained on the same synthetic classification data
// (labels from a fixed random teacher network) with the Muon hybrid and with AdamW, then a
// comparison table. Usage: fogo_demo [steps=300]
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 256));
    head = register_module("head", torch::nn::Linear(256, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return head(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
};
TORCH_MODULE(Mlp);

struct Result {
  double train_loss, test_accuracy, seconds;
};

Result train(const std::string& name, int64_t steps, const torch::Tensor& x, const torch::Tensor& y,
             const torch::Tensor& x_test, const torch::Tensor& y_test) {
  torch::manual_seed(0);
  Mlp net;
  fogo::HybridOptimizer opt =
      name == "muon"
          ? fogo::make_hybrid<fogo::Muon>(*net, fogo::MuonOptions(0.02).ns_dtype(torch::kFloat),
                                          torch::optim::AdamWOptions(3e-3))
          : fogo::HybridOptimizer(
                nullptr, std::make_unique<torch::optim::AdamW>(net->parameters(),
                                                               torch::optim::AdamWOptions(3e-3)));
  const auto start = std::chrono::steady_clock::now();
  double loss_ema = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const auto idx = torch::randint(0, x.size(0), {128});
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(net->forward(x.index({idx})), y.index({idx}));
    loss.backward();
    opt.set_lr_factor(1.0 - static_cast<double>(step) / steps);  // linear decay
    opt.step();
    loss_ema = step == 0 ? loss.item<double>() : 0.95 * loss_ema + 0.05 * loss.item<double>();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  torch::NoGradGuard no_grad;
  const double accuracy =
      net->forward(x_test).argmax(1).eq(y_test).to(torch::kDouble).mean().item<double>();
  return {loss_ema, accuracy, seconds};
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 300;
  if (steps <= 0) {
    std::fprintf(stderr, "fogo_demo: steps must be a positive integer, got %s\n", argv[1]);
    return 2;
  }
  torch::manual_seed(42);
  const auto teacher1 = torch::randn({64, 64}), teacher2 = torch::randn({64, 10});
  auto label = [&](const torch::Tensor& x) {
    return torch::tanh(x.mm(teacher1)).mm(teacher2).argmax(1);
  };
  const auto x = torch::randn({8192, 64}), x_test = torch::randn({2048, 64});
  const auto y = label(x), y_test = label(x_test);

  std::printf("Synthetic 10-class task, MLP 64-256-256-10, %lld steps of batch 128 on CPU\n",
              static_cast<long long>(steps));
  std::printf("%-22s %12s %14s %10s\n", "optimizer", "train loss", "test accuracy", "seconds");
  for (const std::string name : {"muon", "adamw"}) {
    const Result r = train(name, steps, x, y, x_test, y_test);
    std::printf("%-22s %12.4f %14.4f %10.2f\n",
                name == "muon" ? "muon (hybrid, lr 2e-2)" : "adamw (lr 3e-3)", r.train_loss,
                r.test_accuracy, r.seconds);
  }
  return 0;
}
