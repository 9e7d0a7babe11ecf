//! Token sampling (llama.cpp's sampler chain): greedy, or top-k, top-p,
//! min-p and temperature with a seeded generator.
