//! iblab's engine: what it asks of a backend (`backend`), the fabrics that carry each path
//! (`fabric`), the steps (`steps`), and the executor that provisions, runs the steps under
//! deadlines, tears down whatever happened, judges and writes the evidence (`run`). It
//! drives a backend it is handed; the backends themselves are above it.

pub mod backend;
pub mod ctx;
pub mod fabric;
pub mod pingpong;
pub mod run;
pub mod steps;
