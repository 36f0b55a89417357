// Widening Medusa heads to go with a widened target (model/widen.h): `vesper synth
// --widen-medusa DIR --n-embd N -o OUT`. Every dimension of the hidden size is padded with zeros
// to N (weights in the top-left corner, zero biases): the widened target's final hidden state is
// the original one followed by zeros, the padded heads keep those dimensions at zero (SiLU(0) =
// 0), so they propose exactly what the original heads propose for the original target.
#pragma once

#include <cstdint>
#include <string>

#include "core/result.h"

namespace vesper::spec {

// Reads the heads at `from` (a directory as MedusaHeads::load takes), writes `out_dir`/config.json
// (hidden_size set to n_embd) and the padded heads in F32 under the same file name. Errors name
// the file and the field at fault.
Status widen_medusa(const std::string& from, int64_t n_embd, const std::string& out_dir);

}  // namespace vesper::spec
