//! One module per page: the three lessons (one per paper, walking its steps
//! on the teaching preset), then the tools in the order of the work: load ->
//! upcycle -> train / neurons / MoErge + router -> graft -> evaluate -> inspect ->
//! download (+ jobs).

pub mod download;
pub mod evaluate;
pub mod graft;
pub mod inspect;
pub mod jobs;
pub mod lessons;
pub mod load;
pub mod moerge;
pub mod neurons;
pub mod train;
pub mod upcycle;

use leptos::prelude::*;

/// The studio's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// The DeltaMoE lesson.
    LearnDeltaMoe,
    /// The DUME lesson.
    LearnDume,
    /// The NeuronMoE lesson.
    LearnNeuronMoe,
    /// Load models.
    Load,
    /// Dense -> MoE.
    Upcycle,
    /// DeltaMoE's training stages.
    Train,
    /// NeuronMoE analysis and allocation.
    Neurons,
    /// MoErge + ridge router.
    Moerge,
    /// Delta grafting.
    Graft,
    /// Task accuracy (multiple choice, lm-eval semantics).
    Evaluate,
    /// Routing view.
    Inspect,
    /// Downloads.
    Download,
    /// Server jobs.
    Jobs,
}

impl Page {
    /// Tab order.
    pub const ALL: [Page; 13] = [
        Page::LearnDeltaMoe,
        Page::LearnDume,
        Page::LearnNeuronMoe,
        Page::Load,
        Page::Upcycle,
        Page::Train,
        Page::Neurons,
        Page::Moerge,
        Page::Graft,
        Page::Evaluate,
        Page::Inspect,
        Page::Download,
        Page::Jobs,
    ];

    /// URL hash / test id.
    pub fn slug(self) -> &'static str {
        match self {
            Page::LearnDeltaMoe => "learn-deltamoe",
            Page::LearnDume => "learn-dume",
            Page::LearnNeuronMoe => "learn-neuronmoe",
            Page::Load => "load",
            Page::Upcycle => "upcycle",
            Page::Train => "train",
            Page::Neurons => "neurons",
            Page::Moerge => "moerge",
            Page::Graft => "graft",
            Page::Evaluate => "evaluate",
            Page::Inspect => "inspect",
            Page::Download => "download",
            Page::Jobs => "jobs",
        }
    }

    /// Parses a slug.
    pub fn from_slug(s: &str) -> Option<Page> {
        Page::ALL.into_iter().find(|p| p.slug() == s)
    }

    /// Whether it is a lesson (the header shows lessons apart from the
    /// tools).
    pub fn is_lesson(self) -> bool {
        matches!(self, Page::LearnDeltaMoe | Page::LearnDume | Page::LearnNeuronMoe)
    }

    /// Tab title.
    pub fn title(self) -> &'static str {
        match self {
            Page::LearnDeltaMoe => "Lesson · DeltaMoE",
            Page::LearnDume => "Lesson · DUME",
            Page::LearnNeuronMoe => "Lesson · NeuronMoE",
            Page::Load => "1 · Load",
            Page::Upcycle => "2 · Upcycle",
            Page::Train => "Train",
            Page::Neurons => "Neurons",
            Page::Moerge => "MoErge + router",
            Page::Graft => "Graft",
            Page::Evaluate => "Evaluate",
            Page::Inspect => "Inspect",
            Page::Download => "Download",
            Page::Jobs => "Jobs",
        }
    }
}

/// The view of `page`.
pub fn render(page: Page) -> AnyView {
    match page {
        Page::LearnDeltaMoe => lessons::deltamoe::DeltaMoeLesson().into_any(),
        Page::LearnDume => lessons::dume::DumeLesson().into_any(),
        Page::LearnNeuronMoe => lessons::neuronmoe::NeuronMoeLesson().into_any(),
        Page::Load => load::LoadPage().into_any(),
        Page::Upcycle => upcycle::UpcyclePage().into_any(),
        Page::Train => train::TrainPage().into_any(),
        Page::Neurons => neurons::NeuronsPage().into_any(),
        Page::Moerge => moerge::MoergePage().into_any(),
        Page::Graft => graft::GraftPage().into_any(),
        Page::Evaluate => evaluate::EvaluatePage().into_any(),
        Page::Inspect => inspect::InspectPage().into_any(),
        Page::Download => download::DownloadPage().into_any(),
        Page::Jobs => jobs::JobsPage().into_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_round_trip() {
        for p in Page::ALL {
            assert_eq!(Page::from_slug(p.slug()), Some(p));
        }
    }
}
