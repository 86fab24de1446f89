//! Reusable pieces of the pages.

pub mod chart;
pub mod engine_note;
pub mod message;
pub mod model_select;
pub mod progress;
pub mod task_table;
