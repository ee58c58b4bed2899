// Steps Muon once on a tiny linear model through the installed package, then saves and restores
// it through the public checkpoint files (fogo/checkpoint.h), as the trainers do.
#include <fogo/checkpoint.h>
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

  fogo::CheckpointWriter out;
  out.put("step", int64_t{1});
  out.put_module("model", *layer);
  out.put_optimizer("optimizer", opt);
  out.commit("consumer_checkpoint.pt");
  torch::nn::Linear restored(4, 3);
  auto restored_opt = fogo::make_hybrid<fogo::Muon>(*restored, fogo::MuonOptions(0.02),
                                                    torch::optim::AdamWOptions(1e-3));
  fogo::CheckpointReader in("consumer_checkpoint.pt");
  in.load_module("model", *restored);
  in.load_optimizer("optimizer", restored_opt);
  const bool same = in.get_int("step") == 1 && torch::equal(restored->weight, layer->weight);
  std::cout << "consumer: checkpoint " << (same ? "ok" : "did not restore the weight") << "\n";
  return moved && same ? 0 : 1;
}
