// Steps Muon once on a tiny linear model through the installed package.
#include <fogo/fogo.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::nn::Linear layer(4, 3);
  auto opt = fogo::make_hybrid<fogo::Muon>(*layer, fogo::MuonOptions(0.02),
                                           torch::optim::AdamWOptions(1e-3));
  const auto before = layer->weight.detach().clone();
  layer->forward(torch::randn({2, 4})).sum().backward();
  opt.step();
  const bool moved = !torch::equal(before, layer->weight);
  std::cout << "consumer: fogo step " << (moved ? "ok" : "did not move the weight") << "\n";
  return moved ? 0 : 1;
}
