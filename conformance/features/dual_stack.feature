@dual-stack
Feature: Dual stack
  duet publishes and serves both address families, reaches a pod over the client's own family,
  and tells the pod the client's real address in the format of that family.

  Background:
    Given a new random namespace
    Given an Ingress resource named "dual-stack" with this spec:
    """
    defaultBackend:
      service:
        name: echo-service
        port:
          number: 8080
    """
    Then The Ingress status shows the IP address or FQDN where it is exposed

  Scenario: The Ingress status lists both families
    Then the Ingress status must list an IPv4 and an IPv6 address

  Scenario: A client reaches the pod's address of its own family
    When I send a "GET" request to "http://dual-stack"
    Then the response status-code must be 200
    And the response must be served by the "echo-service" service
    And the request must reach the pod over the client's address family

  Scenario: X-Forwarded-For and Forwarded carry the client's real address
    When I send a "GET" request to "http://dual-stack"
    Then the response status-code must be 200
    And the request header "X-Forwarded-For" must be the client's address
    And the request header "Forwarded" must name the client's address
