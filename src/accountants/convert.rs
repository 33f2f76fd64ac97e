//! RDP → (ε, δ) conversions (placeholder, filled with the RDP accountant).
