//! Which Ingresses are ours: IngressClass, the legacy class annotation and the default class.
//!
//! An Ingress is ours when any of these holds:
//!
//! 1. `spec.ingressClassName` names an IngressClass whose `spec.controller` is our controller name
//!    (`--controller-name`, default `duet.dev/ingress-controller`);
//! 2. with `--manifests` only: `spec.ingressClassName` equals our class name (`--ingress-class`,
//!    default `duet`) and **no IngressClass of that name exists**. Manifest folders rarely ship an
//!    IngressClass; once an IngressClass of that name exists, rule 1 decides alone. Against the
//!    Kubernetes API this rule is off: a class name without an IngressClass is nobody's;
//! 3. the legacy annotation `kubernetes.io/ingress.class` equals our class name;
//! 4. it names no class at all (neither field nor annotation) and either one of our
//!    IngressClasses carries `ingressclass.kubernetes.io/is-default-class: "true"`, or
//!    `--watch-ingress-without-class` is set.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::IngressClass;

use crate::stored::StoredIngress;

/// The legacy annotation naming an Ingress's class.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// The IngressClass annotation marking the cluster's default class.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

/// What makes an Ingress ours, from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassConfig {
    /// Our class name (`--ingress-class`).
    pub ingress_class: String,
    /// The `spec.controller` value of our IngressClasses (`--controller-name`).
    pub controller_name: String,
    /// Serve Ingresses that name no class (`--watch-ingress-without-class`).
    pub watch_without_class: bool,
    /// Rule 2: an `ingressClassName` equal to our class name is ours while no IngressClass of
    /// that name exists. On for manifest folders, off against the API, where only an
    /// IngressClass naming our controller makes a class ours.
    pub class_by_flag_name: bool,
}

impl Default for ClassConfig {
    fn default() -> Self {
        ClassConfig {
            ingress_class: "duet".to_owned(),
            controller_name: "duet.dev/ingress-controller".to_owned(),
            watch_without_class: false,
            class_by_flag_name: true,
        }
    }
}

/// The IngressClasses known, by name.
#[derive(Clone, Debug, Default)]
pub struct Classes<'a> {
    by_name: BTreeMap<&'a str, &'a IngressClass>,
}

impl<'a> Classes<'a> {
    /// Indexes IngressClasses by name (nameless ones are ignored).
    pub fn new(classes: impl IntoIterator<Item = &'a IngressClass>) -> Classes<'a> {
        let by_name = classes
            .into_iter()
            .filter_map(|c| c.metadata.name.as_deref().map(|n| (n, c)))
            .collect();
        Classes { by_name }
    }

    /// The IngressClass of a name.
    pub fn get(&self, name: &str) -> Option<&'a IngressClass> {
        self.by_name.get(name).copied()
    }
}

impl ClassConfig {
    /// Whether an IngressClass belongs to our controller.
    pub fn owns_class(&self, class: &IngressClass) -> bool {
        class
            .spec
            .as_ref()
            .and_then(|s| s.controller.as_deref())
            .is_some_and(|c| c == self.controller_name)
    }

    /// Whether a change of this IngressClass can change which Ingresses are ours.
    pub fn concerns(&self, class: &IngressClass) -> bool {
        self.owns_class(class) || class.metadata.name.as_deref() == Some(&*self.ingress_class)
    }

    /// Whether an Ingress is ours (see the module documentation for the rules).
    pub fn is_ours(&self, ingress: &StoredIngress, classes: &Classes<'_>) -> bool {
        let class_name = ingress
            .spec
            .as_ref()
            .and_then(|s| s.ingress_class_name.as_deref())
            .filter(|n| !n.is_empty());
        let legacy = ingress
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
            .filter(|n| !n.is_empty());
        if let Some(name) = class_name {
            let by_field = match classes.get(name) {
                Some(class) => self.owns_class(class),
                None => self.class_by_flag_name && name == self.ingress_class,
            };
            if by_field {
                return true;
            }
        }
        if let Some(name) = legacy {
            if name == self.ingress_class {
                return true;
            }
        }
        if class_name.is_some() || legacy.is_some() {
            return false;
        }
        self.watch_without_class
            || classes.by_name.values().any(|c| {
                self.owns_class(c)
                    && c.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                        .is_some_and(|v| v == "true")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::{Ingress, IngressClassSpec, IngressSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn class(name: &str, controller: &str, default: bool) -> IngressClass {
        let annotations = default.then(|| {
            [(DEFAULT_CLASS_ANNOTATION.to_owned(), "true".to_owned())]
                .into_iter()
                .collect()
        });
        IngressClass {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                annotations,
                ..Default::default()
            },
            spec: Some(IngressClassSpec {
                controller: Some(controller.to_owned()),
                parameters: None,
            }),
        }
    }

    fn ingress(class_name: Option<&str>, legacy: Option<&str>) -> StoredIngress {
        StoredIngress::from(Ingress {
            metadata: ObjectMeta {
                name: Some("web".to_owned()),
                annotations: legacy.map(|l| {
                    [(LEGACY_CLASS_ANNOTATION.to_owned(), l.to_owned())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            },
            spec: Some(IngressSpec {
                ingress_class_name: class_name.map(str::to_owned),
                ..Default::default()
            }),
            status: None,
        })
    }

    const OURS: &str = "duet.dev/ingress-controller";

    #[test]
    fn class_name_naming_our_ingress_class() {
        let cfg = ClassConfig::default();
        let list = [
            class("edge", OURS, false),
            class("nginx", "k8s.io/ingress-nginx", false),
        ];
        let classes = Classes::new(&list);
        assert!(cfg.is_ours(&ingress(Some("edge"), None), &classes));
        assert!(!cfg.is_ours(&ingress(Some("nginx"), None), &classes));
        assert!(!cfg.is_ours(&ingress(Some("missing"), None), &classes));
    }

    #[test]
    fn class_name_equal_to_flag_without_ingress_class_object() {
        let cfg = ClassConfig::default();
        assert!(cfg.is_ours(&ingress(Some("duet"), None), &Classes::default()));
        // Once an IngressClass of that name exists, its controller decides.
        let list = [class("duet", "someone.else/controller", false)];
        assert!(!cfg.is_ours(&ingress(Some("duet"), None), &Classes::new(&list)));
        let list = [class("duet", OURS, false)];
        assert!(cfg.is_ours(&ingress(Some("duet"), None), &Classes::new(&list)));
    }

    #[test]
    fn against_the_api_a_class_name_needs_its_ingress_class() {
        let cfg = ClassConfig {
            class_by_flag_name: false,
            ..ClassConfig::default()
        };
        assert!(!cfg.is_ours(&ingress(Some("duet"), None), &Classes::default()));
        let list = [class("duet", OURS, false)];
        assert!(cfg.is_ours(&ingress(Some("duet"), None), &Classes::new(&list)));
        // The legacy annotation needs no IngressClass.
        assert!(cfg.is_ours(&ingress(None, Some("duet")), &Classes::default()));
    }

    #[test]
    fn legacy_annotation() {
        let cfg = ClassConfig::default();
        assert!(cfg.is_ours(&ingress(None, Some("duet")), &Classes::default()));
        assert!(!cfg.is_ours(&ingress(None, Some("nginx")), &Classes::default()));
        let custom = ClassConfig {
            ingress_class: "public".to_owned(),
            ..ClassConfig::default()
        };
        assert!(custom.is_ours(&ingress(None, Some("public")), &Classes::default()));
        assert!(!custom.is_ours(&ingress(None, Some("duet")), &Classes::default()));
    }

    #[test]
    fn no_class_needs_default_class_or_flag() {
        let cfg = ClassConfig::default();
        let bare = ingress(None, None);
        assert!(!cfg.is_ours(&bare, &Classes::default()));
        let not_default = [class("edge", OURS, false)];
        assert!(!cfg.is_ours(&bare, &Classes::new(&not_default)));
        let default = [class("edge", OURS, true)];
        assert!(cfg.is_ours(&bare, &Classes::new(&default)));
        // Someone else's default class does not make it ours.
        let foreign_default = [class("nginx", "k8s.io/ingress-nginx", true)];
        assert!(!cfg.is_ours(&bare, &Classes::new(&foreign_default)));
        let watch_all = ClassConfig {
            watch_without_class: true,
            ..ClassConfig::default()
        };
        assert!(watch_all.is_ours(&bare, &Classes::default()));
        // The flag does not take Ingresses of other classes.
        assert!(!watch_all.is_ours(
            &ingress(Some("nginx"), None),
            &Classes::new(&foreign_default)
        ));
        assert!(!watch_all.is_ours(&ingress(None, Some("nginx")), &Classes::default()));
    }

    #[test]
    fn default_class_does_not_take_ingresses_of_other_classes() {
        let cfg = ClassConfig::default();
        let list = [
            class("edge", OURS, true),
            class("nginx", "k8s.io/ingress-nginx", false),
        ];
        assert!(!cfg.is_ours(&ingress(Some("nginx"), None), &Classes::new(&list)));
    }

    #[test]
    fn custom_controller_name() {
        let cfg = ClassConfig {
            controller_name: "example.com/duet".to_owned(),
            ..ClassConfig::default()
        };
        let list = [
            class("edge", "example.com/duet", false),
            class("duet-std", OURS, false),
        ];
        let classes = Classes::new(&list);
        assert!(cfg.is_ours(&ingress(Some("edge"), None), &classes));
        assert!(!cfg.is_ours(&ingress(Some("duet-std"), None), &classes));
    }
}
