//! One module per page, in the order of the work: load -> upcycle /
//! neurons / MoErge + router -> graft -> inspect -> download (+ jobs).

pub mod download;
pub mod graft;
pub mod inspect;
pub mod jobs;
pub mod load;
pub mod moerge;
pub mod neurons;
pub mod upcycle;

use leptos::prelude::*;

/// The studio's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// Load models.
    Load,
    /// Dense -> MoE.
    Upcycle,
    /// NeuronMoE analysis and allocation.
    Neurons,
    /// MoErge + ridge router.
    Moerge,
    /// Delta grafting.
    Graft,
    /// Routing view.
    Inspect,
    /// Downloads.
    Download,
    /// Server jobs.
    Jobs,
}

impl Page {
    /// Tab order.
    pub const ALL: [Page; 8] = [
        Page::Load,
        Page::Upcycle,
        Page::Neurons,
        Page::Moerge,
        Page::Graft,
        Page::Inspect,
        Page::Download,
        Page::Jobs,
    ];

    /// URL hash / test id.
    pub fn slug(self) -> &'static str {
        match self {
            Page::Load => "load",
            Page::Upcycle => "upcycle",
            Page::Neurons => "neurons",
            Page::Moerge => "moerge",
            Page::Graft => "graft",
            Page::Inspect => "inspect",
            Page::Download => "download",
            Page::Jobs => "jobs",
        }
    }

    /// Parses a slug.
    pub fn from_slug(s: &str) -> Option<Page> {
        Page::ALL.into_iter().find(|p| p.slug() == s)
    }

    /// Tab title.
    pub fn title(self) -> &'static str {
        match self {
            Page::Load => "1 · Load",
            Page::Upcycle => "2 · Upcycle",
            Page::Neurons => "Neurons",
            Page::Moerge => "MoErge + router",
            Page::Graft => "Graft",
            Page::Inspect => "Inspect",
            Page::Download => "Download",
            Page::Jobs => "Jobs",
        }
    }
}

/// The view of `page`.
pub fn render(page: Page) -> AnyView {
    match page {
        Page::Load => load::LoadPage().into_any(),
        Page::Upcycle => upcycle::UpcyclePage().into_any(),
        Page::Neurons => neurons::NeuronsPage().into_any(),
        Page::Moerge => moerge::MoergePage().into_any(),
        Page::Graft => graft::GraftPage().into_any(),
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
