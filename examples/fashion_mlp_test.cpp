// A short training run on a small real problem: an MLP on a slice of Fashion-MNIST, trained with
// the FOGO hybrid and with the Muon hybrid from the same initialisation and data order, each with
// the paper's class-imbalanced learning rate (FOGO 1e-3 with its preset, Muon 1e-2). Both must
// learn, and FOGO's held-out loss must be comparable to Muon's (within 25%). (Training loss is
// not compared: on a 6,000-sample slice Muon's larger steps fit the training set faster.)
#include <fogo/fogo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "data.h"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 128));
    head = register_module("head", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return head(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
};
TORCH_MODULE(Mlp);

struct Outcome {
  double first_loss, final_loss, test_loss, test_accuracy;
};

Outcome train(const std::string& which, const torch::Tensor& x, const torch::Tensor& y,
              const torch::Tensor& x_test, const torch::Tensor& y_test) {
  torch::manual_seed(0);
  Mlp net;
  const torch::optim::AdamWOptions adamw(1e-3);
  auto opt = which == "fogo" ? fogo::make_hybrid<fogo::FOGO>(
                                   *net, fogo::presets::class_imbalanced_backbone(), adamw)
                             : fogo::make_hybrid<fogo::Muon>(
                                   *net, fogo::MuonOptions(1e-2).ns_dtype(torch::kFloat), adamw);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  double first = 0, ema = 0;
  const int64_t steps = 200;
  for (int64_t step = 0; step < steps; ++step) {
    const auto idx = at::randint(0, x.size(0), {128}, gen, torch::kLong);
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(net->forward(x.index({idx})), y.index({idx}));
    loss.backward();
    opt.step();
    const double v = loss.item<double>();
    if (step == 0) first = ema = v;
    ema = 0.9 * ema + 0.1 * v;
  }
  torch::NoGradGuard no_grad;
  const auto logits = net->forward(x_test);
  return {first, ema, torch::nn::functional::cross_entropy(logits, y_test).item<double>(),
          logits.argmax(1).eq(y_test).to(torch::kDouble).mean().item<double>()};
}

}  // namespace

TEST(FashionMnistMlp, FogoReachesALossComparableToMuon) {
  const auto data = fogo::resnet::load_fashion_mnist("/usr/share/datasets/fashion-mnist");
  auto flat = [](const torch::Tensor& images) {
    return images.to(torch::kFloat)
        .div_(255.0)
        .sub_(0.286)
        .div_(0.353)
        .reshape({images.size(0), -1});
  };
  const auto x = flat(data.train.images.slice(0, 0, 6000));
  const auto y = data.train.labels.slice(0, 0, 6000);
  const auto x_test = flat(data.test.images.slice(0, 0, 2000));
  const auto y_test = data.test.labels.slice(0, 0, 2000);

  const Outcome muon = train("muon", x, y, x_test, y_test);
  const Outcome fogo = train("fogo", x, y, x_test, y_test);
  for (const auto& [name, r] : {std::pair{"muon", muon}, std::pair{"fogo", fogo}}) {
    std::cout << name << ": train loss " << r.first_loss << " -> " << r.final_loss << ", test loss "
              << r.test_loss << ", test accuracy " << r.test_accuracy << "\n";
    EXPECT_LT(r.final_loss, 0.3 * r.first_loss) << name;
    EXPECT_GT(r.test_accuracy, 0.75) << name;
  }
  EXPECT_LT(fogo.test_loss, 1.25 * muon.test_loss);
}
