#pragma once
// fogo: FOGO and Muon for LibTorch. Include this for everything.
#include <fogo/adamw.h>
#include <fogo/fogo_optimizer.h>
#include <fogo/hybrid.h>
#include <fogo/muon.h>
#include <fogo/newton_schulz.h>
#include <fogo/ns_dtype.h>
#include <fogo/param_groups.h>
#include <fogo/tensor_states.h>
