@dual-stack
Feature: IPv6-only Service
  A Service with `ipFamilies: [IPv6]` has only an IPv6 EndpointSlice; duet serves it to clients of
  both families.

  Scenario: An IPv6-only Service serves clients of both families
    Given a new random namespace
    Given a Service "v6-only" with these pods:
      | pod          | ipv4   | ipv6   |
      | v6-only-pod  | absent | listen |
    Given an Ingress resource named "ipv6-only-service" with this spec:
    """
    rules:
    - host: ipv6-only-service
      http:
        paths:
        - path: /
          pathType: Prefix
          backend:
            service:
              name: v6-only
              port:
                number: 8080
    """
    Then The Ingress status shows the IP address or FQDN where it is exposed
    When I send 20 requests to "http://ipv6-only-service"
    Then every response status-code must be 200
    And the pod "v6-only-pod" must be reached over IPv6
