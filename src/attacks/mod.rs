//! Attacks on trained models and mechanisms; [`audit`] holds the reusable Clopper–Pearson /
//! empirical-ε machinery.

pub mod audit;
